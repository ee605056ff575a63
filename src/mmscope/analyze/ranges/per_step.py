"""The per-step view: each step's time by part (the encoder, the rest of preprocess, and the ranges
beside preprocess on its thread until the next step: forward, sample, postprocess, ...) with its
kind and batch shape, and its device time where the profile has one, for at most MAX_STEPS steps
taken evenly over the profile.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from mmscope import stages
from mmscope.analyze.ranges.steps import KINDS, SHAPE_FIELDS

MAX_STEPS = 2000
TOP_PARTS = 4  # the ranges beside preprocess that take most time; the others are "other"
ENCODER, PREPROCESS_REST, OTHER = "encoder", "preprocess (rest)", "other"

def sample(n: int, most: int = MAX_STEPS) -> np.ndarray:
    """Positions of at most `most` of n items, evenly spread, first and last included."""
    if n <= most:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, most).round().astype(np.int64))


def per_step(frame, step_table) -> dict | None:
    """{"steps": how many, "shown": how many, "t0_ns", "parts": names, and per shown step
    "start_ns" (from t0), "kind", the shape, "ns" (time per part) and "device_ns" (the device
    time of its preprocess and the ranges beside it; None without a device side)}, or None
    without steps."""
    table = frame.table
    stepped = np.flatnonzero(step_table["forward"] >= 0)
    if len(stepped) == 0:
        return None
    picked = stepped[sample(len(stepped))]
    pre = step_table["pre"][picked]
    ends = _next_start(step_table, picked)
    got = _parts(frame, {"thread": table.thread[pre], "start": table.start[pre], "end": ends,
                         "parent": table.parent[pre]})
    stage_names = [frame.stages[s] for s in got["stage"].tolist()]
    beside = _top(stage_names, got["ns"])
    parts = [ENCODER, PREPROCESS_REST] + beside + [OTHER]
    ns = np.zeros((len(picked), len(parts)), np.int64)
    ns[:, 0] = step_table["encoder_ns"][picked]
    ns[:, 1] = step_table["pre_ns"][picked] - ns[:, 0]
    column = {name: 2 + j for j, name in enumerate(beside)}
    for step, name, t in zip(got["step"].tolist(), stage_names, got["ns"].tolist()):
        if name != stages.PREPROCESS:  # the step's own preprocess: encoder and the rest
            ns[step, column.get(name, len(parts) - 1)] += t
    t0 = int(table.start.min())
    device_ns = None
    if "device_ns" in frame.ranges:  # the step's preprocess is among its window's ranges
        device_ns = np.bincount(got["step"], weights=got["device_ns"],
                                minlength=len(pre)).astype(np.int64).tolist()
    return {"steps": len(stepped), "shown": len(picked), "t0_ns": t0, "parts": parts,
            "device_ns": device_ns,
            "start_ns": (table.start[pre] - t0).tolist(),
            "kind": [KINDS[k] for k in step_table["kind"][picked].tolist()],
            **{f: step_table[f][picked].tolist() for f in SHAPE_FIELDS},
            "ns": ns.tolist()}


@njit(cache=True, nogil=True)
def _in_windows(group, n_subs, start, parent, w_off, w_start, w_index, w_end, w_parent, out_row,
                out_at):
    """The rows that lie in a window: of the windows on a row's thread starting at or before
    it, the latest (w_* sorted by thread and start, w_off[t] the first of thread t's), when the
    row starts before its end and has its parent. Returns how many (out_* filled up to room)."""
    found = 0
    for i in range(len(group)):
        t = group[i] // n_subs
        lo, hi = w_off[t], w_off[t + 1]
        if lo == hi or w_start[lo] > start[i]:
            continue
        while hi - lo > 1:  # the last window starting at or before the row
            mid = (lo + hi) // 2
            if w_start[mid] <= start[i]:
                lo = mid
            else:
                hi = mid
        w = w_index[lo]
        if start[i] < w_end[w] and parent[i] == w_parent[w]:
            if found < len(out_row):
                out_row[found] = i
                out_at[found] = w
            found += 1
    return found


def _parts(frame, windows: dict) -> dict[str, np.ndarray]:
    """Per step and stage, the time of the ranges beside the step's preprocess in its window:
    the stage ranges with the preprocess' parent that start in the window on its thread (of
    windows starting at or before a range on its thread, the latest holds it)."""
    table, ranges = frame.table, frame.ranges
    w_thread = np.searchsorted(table.threads, windows["thread"])
    order = np.lexsort((np.arange(len(w_thread)), windows["start"], w_thread))
    w_off = np.searchsorted(w_thread[order], np.arange(len(table.threads) + 1))
    args = (table.group, table.n_subs, table.start, table.parent, w_off,
            windows["start"][order], order, windows["end"], windows["parent"])
    room = 0
    while True:
        rows, at = np.empty(room, np.int64), np.empty(room, np.int64)
        found = _in_windows(*args, rows, at)
        if found <= room:
            rows, at = rows[:found], at[:found]
            break
        room = found
    n_stages = len(frame.stages)
    keys, inverse = np.unique(at * n_stages + ranges["stage"][rows], return_inverse=True)
    ns = np.zeros(len(keys), np.int64)
    np.add.at(ns, inverse, ranges["end"][rows] - ranges["start"][rows])
    device_ns = np.zeros(len(keys), np.int64)
    if "device_ns" in ranges:
        np.add.at(device_ns, inverse, np.maximum(ranges["device_ns"][rows], 0))
    return {"step": keys // n_stages, "stage": keys % n_stages, "ns": ns, "device_ns": device_ns}


def _next_start(step_table, picked: np.ndarray) -> np.ndarray:
    """Where each picked step's window ends: the next preprocess on its thread (steps are in
    time order), or never."""
    thread, start = step_table["thread"], step_table["start"]
    order = np.lexsort((np.arange(len(thread)), start, thread))
    following = np.full(len(thread), np.iinfo(np.int64).max)
    same = thread[order[1:]] == thread[order[:-1]]
    following[order[:-1][same]] = start[order[1:][same]]
    return following[picked]


def _top(names: list[str], ns: np.ndarray) -> list[str]:
    total: dict[str, int] = {}
    for name, t in zip(names, ns.tolist()):
        total[name] = total.get(name, 0) + t
    total.pop(stages.PREPROCESS, None)
    return sorted(total, key=lambda n: (-total[n], n))[:TOP_PARTS]
