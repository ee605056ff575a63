"""The step join: each forward range with the nearest preceding step_meta on the same thread.

It gives forward time against the step's batch shape (prefill/decode tokens, requests).
"""
from __future__ import annotations

import itertools
import re

import numpy as np

from mmscope import stages
from mmscope.analyze.table import RangeTable, latest_before

SHAPE_FIELDS = ("prefill", "decode", "total", "reqs")


def _lines_pattern() -> re.Pattern | None:
    """`stages.parse_step_meta`'s regex for many names at once, one per line: the same groups,
    empty where a line is no step_meta. None where that regex is not of the `^...$` form."""
    rx = getattr(stages, "_STEP_META_RE", None)
    pattern = getattr(rx, "pattern", "")
    if (not isinstance(pattern, str) or not pattern.startswith("^") or not pattern.endswith("$")
            or rx.groups != 4 or rx.flags != re.UNICODE):
        return None
    return re.compile(f"^(?:{pattern[1:-1]}|.*)$", re.M)


_STEP_META_LINES = _lines_pattern()


def step_meta_shapes(table: RangeTable) -> tuple[np.ndarray, np.ndarray]:
    """The (prefill, decode, total, reqs) per name id (-1s: no step_meta), and the ids of the
    parseable step_meta names."""
    if "step_meta_shapes" not in table._cache:
        shapes = np.full((len(table.names), 4), -1, dtype=np.int64)
        at = [i for i, name in enumerate(table.names) if name.startswith(stages.STEP_META_PREFIX)]
        if at:
            shapes[at] = _parse_shapes([table.names[i] for i in at])
        table._cache["step_meta_shapes"] = (shapes, np.flatnonzero(shapes[:, 0] >= 0))
    return table._cache["step_meta_shapes"]


STEP_META_ROWS = ("ids", "step_meta")  # RangeTable.find_rows' key of the step_meta rows


def step_meta_rows(table: RangeTable) -> tuple[np.ndarray, np.ndarray]:
    """Rows of parseable step_meta ranges, and the (prefill, decode, total, reqs) per name id."""
    shapes, ids = step_meta_shapes(table)
    if STEP_META_ROWS not in table._cache:
        table._cache[STEP_META_ROWS] = table.rows_with_ids(ids)
    return table._cache[STEP_META_ROWS], shapes


def _parse_shapes(names: list[str]) -> np.ndarray:
    """(prefill, decode, total, reqs) of each name, -1s where it is no step_meta.

    Every profile step has its own step_meta name (hundreds of thousands in a long run), so they
    are matched in one pass over their joined text and their numbers parsed in one call; names
    where that could differ from `stages.parse_step_meta` (non-ASCII digits, line breaks, numbers
    past int64) go one by one, and so do all when a sample disagrees with it."""
    out = _parse_joined(names)
    if out is not None:
        return out
    out = np.full((len(names), 4), -1, dtype=np.int64)
    for j, name in enumerate(names):
        out[j] = _shape_of(name)
    return out


def _shape_of(name: str) -> tuple[int, int, int, int]:
    shape = stages.parse_step_meta(name)
    return (-1, -1, -1, -1) if shape is None else (shape.prefill, shape.decode, shape.total,
                                                    shape.reqs)


def _parse_joined(names: list[str]) -> np.ndarray | None:
    text = "\n".join(names)
    if (_STEP_META_LINES is None or not names or not text.isascii()
            or text.count("\n") != len(names) - 1):
        return None
    out = _parse_regex(names, text)
    if out is None:
        return None
    sample = {0, len(names) // 2, len(names) - 1}
    if any(tuple(out[j].tolist()) != _shape_of(names[j]) for j in sample):
        return None
    return out


def _parse_regex(names: list[str], text: str) -> np.ndarray | None:
    found = _STEP_META_LINES.findall(text)
    digits = list(itertools.chain.from_iterable(f for f in found if f[0]))
    if len(found) != len(names) or max(map(len, digits), default=0) > 18:
        return None
    values = np.fromstring(" ".join(digits), dtype=np.int64, sep=" ")
    if len(values) != len(digits):
        return None
    out = np.full((len(names), 4), -1, dtype=np.int64)
    out[np.fromiter((f[0] != "" for f in found), bool, len(found))] = values.reshape(-1, 4)
    return out


class StepPairs:
    """The step join's columns (numpy, equal length), one row per joined forward: `len()` is the
    number of rows and `pairs[name]` a column, as of a DataFrame."""

    COLUMNS = ("forward_row", "meta_row", "thread", "start", "forward_ns") + SHAPE_FIELDS

    def __init__(self, columns: dict[str, np.ndarray]):
        self._columns = columns

    def __len__(self) -> int:
        return len(self._columns["forward_row"])

    def __getitem__(self, name: str) -> np.ndarray:
        return self._columns[name]


def step_join(table: RangeTable) -> StepPairs:
    """One row per forward that found a step_meta, in time order (start, then row)."""
    forwards = table.rows_named(stages.FORWARD)
    metas, shapes = step_meta_rows(table)
    meta_of = latest_before(table, metas, forwards)
    hit = meta_of >= 0
    f, m = forwards[hit], meta_of[hit]
    start = table.start[f]
    order = np.argsort(start, kind="stable")  # forwards come in row order: ties stay by row
    f, m, start = f[order], m[order], start[order]
    ids = table.name_id[m]
    by_field = np.ascontiguousarray(shapes.T)  # one 1-D gather per field, not rows of four
    return StepPairs({"forward_row": f, "meta_row": m, "thread": table.thread[f], "start": start,
                      "forward_ns": table.end[f] - start,
                      **{k: by_field[j][ids] for j, k in enumerate(SHAPE_FIELDS)}})


def kind_of(prefill: np.ndarray, decode: np.ndarray) -> np.ndarray:
    """'prefill', 'decode', 'mixed' or 'idle' per step."""
    out = np.full(len(prefill), "idle", dtype=object)
    out[(prefill > 0) & (decode == 0)] = "prefill"
    out[(prefill == 0) & (decode > 0)] = "decode"
    out[(prefill > 0) & (decode > 0)] = "mixed"
    return out


def summary(table: RangeTable, pairs) -> dict:
    """Counts, unmatched ranges, forward time per step kind and a linear fit against tokens."""
    forwards = len(table.rows_named(stages.FORWARD))
    metas = len(step_meta_rows(table)[0])
    joined = 0
    if len(pairs):
        seen = np.zeros(len(table), bool)
        seen[pairs["meta_row"]] = True
        joined = int(np.count_nonzero(seen))
    fit, fit_reason = _fit(pairs)
    out = {"pairs": len(pairs), "forwards": forwards, "step_metas": metas,
           "unmatched_forwards": forwards - len(pairs), "unjoined_step_metas": metas - joined,
           "by_kind": _by_kind(pairs), "fit": fit, "fit_reason": fit_reason,
           "available": len(pairs) > 0, "reason": _missing(forwards, metas, len(pairs))}
    return out


def _missing(forwards: int, metas: int, pairs: int) -> str | None:
    """Why the step join has nothing to show (None: it has)."""
    if pairs:
        return None
    if forwards == 0 and metas == 0:
        return (f"the profile has no '{stages.FORWARD}' and no step_meta ranges: forward time "
                "against batch shape is unknown")
    if forwards == 0:
        return f"the profile has no '{stages.FORWARD}' ranges ({metas} step_meta)"
    if metas == 0:
        return (f"the profile has no step_meta ranges ({forwards} forwards): their batch "
                "shapes are unknown")
    return (f"no '{stages.FORWARD}' follows a step_meta on its thread ({forwards} forwards, "
            f"{metas} step_meta)")


def _by_kind(pairs) -> list[dict]:
    if len(pairs) == 0:
        return []
    fwd, total = pairs["forward_ns"], pairs["total"]
    prefill, decode = pairs["prefill"], pairs["decode"]
    # kind_of's classes as masks (no string per step).
    masks = {"prefill": (prefill > 0) & (decode == 0), "decode": (prefill == 0) & (decode > 0),
             "mixed": (prefill > 0) & (decode > 0)}
    masks["idle"] = ~(masks["prefill"] | masks["decode"] | masks["mixed"])
    out = []
    for k in ("prefill", "decode", "mixed", "idle"):
        sel = masks[k]
        n = int(sel.sum())
        if n == 0:
            continue
        mine = fwd[sel]
        rank = (50 * n + 99) // 100 - 1
        out.append({"kind": k, "steps": n, "forward_mean_ns": int(round(mine.mean())),
                    "forward_p50_ns": int(np.partition(mine, rank)[rank]),
                    "tokens_mean": round(float(total[sel].mean()), 3)})
    return out


def _fit(pairs) -> tuple[dict | None, str | None]:
    """Least squares forward_ns = intercept + slope * total tokens, or None and why not."""
    if len(pairs) < 2:
        return None, f"{len(pairs)} joined step(s); a fit needs two or more"
    x = pairs["total"].astype(np.float64)
    y = pairs["forward_ns"].astype(np.float64)
    if np.ptp(x) == 0:
        return None, f"every joined step has {int(x[0])} tokens; a fit needs two batch sizes"
    slope, intercept = np.polyfit(x, y, 1)
    resid = y - (intercept + slope * x)
    r2 = 1.0 - float(resid @ resid) / float(((y - y.mean()) ** 2).sum()) if np.ptp(y) else 1.0
    return {"ns_per_token": round(float(slope), 3), "intercept_ns": round(float(intercept), 1),
            "r2": round(r2, 4)}, None
