"""Stage families: range names that differ only in numbers (torch's `aten::to, seq = 12, op_id =
99`, vLLM's `execute_context_1(888_788544)_generation_0(0)`) are one stage, named by their
pattern, so that a profile of a million numbered names reads as a few dozen stages.

The catalogue's names keep their own handling (every step_meta is one stage, the others are
themselves); a pattern that only one name has leaves that name as it is.
"""
from __future__ import annotations

import re
from collections import Counter

import numpy as np

from mmscope import stages

NUMBER, HASH = "<n>", "<hash>"
# A number (decimal, or hex with its 0x) stands alone or inside a word; a hash is a run of 16 or
# more letters and digits holding both (a graph's or a tensor's id).
_NUMBER = re.compile(r"0[xX][0-9a-fA-F]+|\d+")
_HASH = re.compile(r"(?<![0-9A-Za-z])(?=[0-9A-Za-z]*\d)(?=[0-9A-Za-z]*[A-Za-z])[0-9A-Za-z]{16,}"
                   r"(?![0-9A-Za-z])")
CATALOGUE_PREFIXES = (stages.HASH_PREFIX, stages.PROCESSOR_PREFIX, stages.MEDIA_PREFIX)


def pattern(name: str) -> str:
    """The name with its numbers (and hashes) as placeholders."""
    return _NUMBER.sub(NUMBER, _HASH.sub(HASH, name))


def _own(name: str) -> str | None:
    """The stage a name is by the catalogue's rules, None where its family decides."""
    if name.startswith(stages.STEP_META_PREFIX):
        return stages.STEP_META_STAGE
    if name in stages.ALL_FIXED or name.startswith(CATALOGUE_PREFIXES):
        return name
    return None


def stage_names(names: list[str], raw: bool = False):
    """(stage list, name id -> stage id, the family of each stage: (pattern, distinct names) or
    None): every step_meta name is one stage; other names form families unless `raw`."""
    keys = [_own(name) or (name if raw else pattern(name)) for name in names]
    several = {k for k, c in Counter(keys).items() if c > 1}
    index: dict[str, int] = {}
    codes = []
    for name, key in zip(names, keys):
        if key not in several and _own(name) is None:
            key = name  # a family of one is its name
        codes.append(index.setdefault(key, len(index)))
    codes = np.array(codes, dtype=np.int32).reshape(len(names))
    count = np.bincount(codes, minlength=len(index))
    family = [(key, int(count[s])) if key in several and key != stages.STEP_META_STAGE
              and not raw and count[s] > 1 else None for key, s in index.items()]
    return list(index), codes, family
