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
    got = _parts(frame, {"pre": pre, "start": table.start[pre], "end": ends,
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
    if frame.device is not None:  # the step's preprocess is among its window's ranges
        device_ns = np.bincount(got["step"], weights=got["device_ns"],
                                minlength=len(pre)).astype(np.int64).tolist()
    return {"steps": len(stepped), "shown": len(picked), "t0_ns": t0, "parts": parts,
            "device_ns": device_ns,
            "start_ns": (table.start[pre] - t0).tolist(),
            "kind": [KINDS[k] for k in step_table["kind"][picked].tolist()],
            **{f: step_table[f][picked].tolist() for f in SHAPE_FIELDS},
            "ns": ns.tolist()}


@njit(cache=True, nogil=True)
def _in_windows(w_group, w_start, w_end, w_parent, n_subs, rows, off, start, parent, out_row,
                out_at):
    """The rows that lie in a window: on the window's thread (in any of its nesting groups,
    `w_group` the first), starting in [its start, its end), with its parent. Each group's rows
    come by start (`rows`, `off`: table.rows_by_group): a search finds the window's first.
    Returns how many (out_* filled up to their room)."""
    found = 0
    for w in range(len(w_group)):
        for g in range(w_group[w], w_group[w] + n_subs):
            a, b = off[g], off[g + 1]
            while a < b:  # the first row of the group starting at or after the window
                m = (a + b) // 2
                if start[rows[m]] < w_start[w]:
                    a = m + 1
                else:
                    b = m
            for k in range(a, off[g + 1]):
                i = rows[k]
                if start[i] >= w_end[w]:
                    break
                if parent[i] == w_parent[w]:
                    if found < len(out_row):
                        out_row[found] = i
                        out_at[found] = w
                    found += 1
    return found


def _parts(frame, windows: dict) -> dict[str, np.ndarray]:
    """Per step and stage, the time of the ranges beside the step's preprocess in its window:
    the stage ranges with the preprocess' parent that start in the window on its thread (the
    windows of a thread do not overlap: each ends where the thread's next step starts)."""
    table, ranges = frame.table, frame.ranges
    rows_by_group, off = table.rows_by_group()
    w_group = table.group[windows["pre"]] // table.n_subs * table.n_subs
    args = (w_group, windows["start"], windows["end"], windows["parent"], table.n_subs,
            rows_by_group, off, table.start, table.parent)
    room = 0  # the windows' rows are counted first (few: the windows are few)
    while True:
        rows, at = np.empty(room, np.int64), np.empty(room, np.int64)
        found = _in_windows(*args, rows, at)
        if found <= room:
            break
        room = found
    n_stages = len(frame.stages)
    stage = frame.stage_of_name[table.name_id[rows]]
    keys, inverse = np.unique(at * n_stages + stage, return_inverse=True)
    ns = np.zeros(len(keys), np.int64)
    np.add.at(ns, inverse, ranges["end"][rows] - ranges["start"][rows])
    device_ns = np.zeros(len(keys), np.int64)
    if frame.device is not None:
        np.add.at(device_ns, inverse, np.maximum(frame.device.device_of(rows), 0))
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
