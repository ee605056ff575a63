"""The analysis cache: a second `mmscope analyze` of an unchanged file answers from a stored result.

Imports nothing heavy, so a warm run never loads numpy or polars; an unreadable entry is a miss.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile

# Bumped whenever what an entry holds, or how any number in it is computed, changes.
FORMAT = 5
HEAD_BYTES = 4096  # hashed into the key: an SQLite header changes on every write transaction
# Files beside an SQLite database that its contents depend on: a commit may sit in the -wal.
COMPANION_SUFFIXES = ("-wal",)
TRACE_SUFFIXES = (".json", ".json.gz")  # the files of a trace folder, as formats reads them


def directory() -> str:
    """$XDG_CACHE_HOME/mmscope/analyze, or ~/.cache/mmscope/analyze (XDG: relative paths are
    ignored)."""
    from mmscope.cache_dir import cache_dir

    return cache_dir("analyze")


def key_for(path: str, name_filter: str | None, raw_names: bool = False) -> dict | None:
    """What an entry for this file (or folder of traces) and these options must match: every
    file the answer is read from, by path, size, times, inode and first bytes. None where the
    input cannot be keyed (unreadable: the analysis itself says what is wrong)."""
    from mmscope import __version__

    try:
        real = os.path.realpath(path)
        if os.path.isdir(real):
            files = sorted(os.path.join(real, f) for f in os.listdir(real)
                           if f.endswith(TRACE_SUFFIXES))
        elif os.path.isfile(real):
            files = [real] + [real + s for s in COMPANION_SUFFIXES if os.path.exists(real + s)]
        else:
            return None
        stamps = [_stamp(f) for f in files]
    except (OSError, ValueError):
        return None
    return {"format": FORMAT, "mmscope": __version__, "path": real, "files": stamps,
            "filter": name_filter, "raw_names": raw_names}


def _stamp(path: str) -> dict:
    st = os.stat(path)
    with open(path, "rb") as f:
        head = hashlib.sha256(f.read(HEAD_BYTES)).hexdigest()
    return {"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns, "inode": st.st_ino, "device": st.st_dev,
            "head_sha256": head}


def _entry_path(key: dict) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return os.path.join(directory(), digest + ".json")


def read(key: dict | None) -> dict | None:
    """The stored analysis for this key, or None: absent, unreadable, corrupt or another key."""
    if key is None:
        return None
    try:
        with open(_entry_path(key), encoding="utf-8") as f:
            entry = json.load(f)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != key:
        return None
    doc = entry.get("analysis")
    from mmscope.analyze.report.analysis import DOC_KEYS

    if not isinstance(doc, dict) or not all(k in doc for k in DOC_KEYS):
        return None
    return doc


def write(key: dict | None, doc: dict) -> None:
    """Store the analysis; a cache that cannot be written is skipped without a word."""
    if key is None:
        return
    target = _entry_path(key)
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"key": key, "analysis": doc}, f, separators=(",", ":"))
            os.replace(tmp, target)  # readers see the whole entry or none
        except BaseException:
            os.unlink(tmp)
            raise
    except (OSError, TypeError, ValueError):
        pass
