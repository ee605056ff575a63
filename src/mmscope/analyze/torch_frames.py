"""The torch profiler's own frames: a `record_function` range opens inside `__enter__` and closes
inside `__exit__`, so with Python stacks recorded it overlaps those frames partly, by design.

Such overlaps are the profiler's way of recording, not ranges that overlap partly: the check
"ranges nest" leaves them out (`RangeTable.own_overlaps`).
"""
from __future__ import annotations

import re

import numpy as np

from mmscope.analyze.table import RangeTable

# torch.autograd.profiler.record_function's methods, as the profiler names Python frames.
ENTER = re.compile(r"(^|/)torch/autograd/profiler\.py\(\d+\): __enter__$")
EXIT = re.compile(r"(^|/)torch/autograd/profiler\.py\(\d+\): __exit__$")


def settle(table: RangeTable) -> RangeTable:
    """Set `table.own_overlaps`: the crossing rows whose every partial overlap is a recorded
    range against the frames that open it (the __enter__ frame, what it calls, what calls it
    and returns before the range ends) or against the frames that close it."""
    enter, exit_ = _frames(table, ENTER), _frames(table, EXIT)
    if len(table.crossing) == 0 or len(enter) == 0 or len(exit_) == 0:
        return table
    opener = _holder(table, enter, table.start)
    closer = _holder(table, exit_, table.end)
    partners = _Partners(table)
    own = [c for c in table.crossing.tolist()
           if all(_by_design(table, c, j, opener, closer) for j in partners.of(c))]
    table.own_overlaps = np.array(own, np.int64)
    return table


def _frames(table: RangeTable, pattern: re.Pattern) -> np.ndarray:
    ids = [i for i, name in enumerate(table.names) if pattern.search(name)]
    return table.rows_with_ids(np.array(ids, np.int64))


def _holder(table: RangeTable, frames: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Per row, the frame of its thread that holds the time `at[row]` (-1: none). Frames of one
    kind never nest on a thread, so the last one started at or before that time is the one."""
    order = np.lexsort((table.start[frames], table.thread[frames]))
    f = frames[order]
    pos = _search(table.thread[f], table.start[f], table.thread, at) - 1
    cand = f[np.maximum(pos, 0)]
    ok = (pos >= 0) & (table.thread[cand] == table.thread) & (at <= table.end[cand])
    return np.where(ok, cand, -1)


def _search(key_a, key_b, probe_a, probe_b) -> np.ndarray:
    """searchsorted(side="right") of (a, b) pairs among pairs sorted lexicographically."""
    view = [("a", np.int64), ("b", np.int64)]
    keys = np.ascontiguousarray(np.stack([key_a, key_b], 1)).view(view).ravel()
    probe = np.ascontiguousarray(np.stack([probe_a, probe_b], 1)).view(view).ravel()
    return np.searchsorted(keys, probe, side="right")


class _Partners:
    """The ranges a crossing row overlaps partly: of its thread (a Chrome trace nests each
    thread as one group), begun before it and ended strictly inside it."""

    def __init__(self, table: RangeTable):
        self.table = table
        self.by_end = np.lexsort((table.end, table.thread))
        self.keys = (table.thread[self.by_end], table.end[self.by_end])

    def of(self, row: int) -> np.ndarray:
        t = self.table
        lo, hi = _search(*self.keys, [t.thread[row]] * 2, [t.start[row], t.end[row] - 1])
        cand = self.by_end[lo:hi]
        return cand[t.start[cand] < t.start[row]]


def _by_design(table: RangeTable, c: int, j: int, opener, closer) -> bool:
    """c overlapping j partly (j began first) is record_function at work: c is a recorded
    range and j one of the frames that open it, or j is a recorded range and c one of the
    frames that close it. Two recorded ranges that overlap partly are no frames of each other."""
    recorded_c = opener[c] >= 0 and closer[c] >= 0
    recorded_j = opener[j] >= 0 and closer[j] >= 0
    if recorded_c == recorded_j:
        return False
    return (_on_chain(table, j, opener[c]) if recorded_c
            else _on_chain(table, c, closer[j]))


def _on_chain(table: RangeTable, row: int, frame: int) -> bool:
    """`row` is the frame, lies inside it, or holds it (calls it)."""
    if frame < 0:
        return False
    s, e, fs, fe = table.start[row], table.end[row], table.start[frame], table.end[frame]
    return bool((s <= fs and fe <= e) or (fs <= s and e <= fe))
