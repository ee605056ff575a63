"""Per-group figures of the ranges (a group: a node of the stage tree, or a stage), in compiled
passes over the rows: count, total, self time, min, max, device and kernel time, and the p50,
p90 and p99 durations (nearest rank: always a measured duration).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from mmscope.analyze.ranges.nesting import offsets

PERCENTILES = (50, 90, 99)


@njit(cache=True, nogil=True)
def _sums(parent, start, end, key, n_keys, out):
    """Per key: count, total, self (a range's time less its children's, never below zero), min
    and max into `out` (n_keys, 7)."""
    n = len(start)
    children = np.zeros(n, np.int64)
    for i in range(n):
        p = parent[i]
        if p >= 0:
            children[p] += end[i] - start[i]
    for k in range(n_keys):
        out[k, 3] = np.iinfo(np.int64).max
        out[k, 4] = np.iinfo(np.int64).min
    for i in range(n):
        d = end[i] - start[i]
        k = key[i]
        out[k, 0] += 1
        out[k, 1] += d
        out[k, 2] += d - min(children[i], d)
        out[k, 3] = min(out[k, 3], d)
        out[k, 4] = max(out[k, 4], d)


@njit(cache=True, nogil=True)
def _device_sums(rows, device, kernel, key, out):
    """Per key: device time (over the ranges with device work of their own) and kernel time
    into out[:, 5] and out[:, 6]; `rows` the rows that hold device work, with theirs."""
    for j in range(len(rows)):
        k = key[rows[j]]
        if device[j] >= 0:
            out[k, 5] += device[j]
        out[k, 6] += kernel[j]


@njit(cache=True, nogil=True)
def _select(a, lo, hi, k):
    """a[k] as if a[lo:hi + 1] were sorted, moving its values in place (quickselect: Hoare's
    partition around a median of three, which stays linear on sorted, reversed and repeated
    durations)."""
    while hi > lo:
        mid = (lo + hi) // 2
        if a[mid] < a[lo]:
            a[mid], a[lo] = a[lo], a[mid]
        if a[hi] < a[lo]:
            a[hi], a[lo] = a[lo], a[hi]
        if a[hi] < a[mid]:
            a[hi], a[mid] = a[mid], a[hi]
        pivot = a[mid]
        i, j = lo - 1, hi + 1
        while True:  # afterwards a[lo..j] <= pivot <= a[j + 1..hi], with lo <= j < hi
            i += 1
            while a[i] < pivot:
                i += 1
            j -= 1
            while a[j] > pivot:
                j -= 1
            if i >= j:
                break
            a[i], a[j] = a[j], a[i]
        if k <= j:
            hi = j
        else:
            lo = j + 1
    return a[k]


@njit(cache=True, nogil=True)
def _grouped(start, end, node, slot_of_node, off, grouped):
    """The durations grouped by their node's slot into `grouped`: slot k's at [off[k],
    off[k + 1])."""
    at = off[:-1].copy()
    for i in range(len(node)):
        k = slot_of_node[node[i]]
        grouped[at[k]] = end[i] - start[i]
        at[k] += 1


@njit(cache=True, nogil=True)
def _ranked(grouped, off, ranks, out):
    """Per group k (grouped[off[k]:off[k + 1]]) the durations of rank ranks[k, j] (0-based,
    descending per group) into out[k, j], selected in place: a group's values stay in its
    slice, so groups made of consecutive groups can be ranked after."""
    for k in range(len(off) - 1):
        lo, hi = off[k], off[k + 1] - 1
        for j in range(ranks.shape[1]):  # each rank within what the larger one left below it
            if hi < lo:
                break
            r = lo + ranks[k, j]
            out[k, j] = _select(grouped, lo, hi, r)
            hi = r


def nearest_ranks(counts: np.ndarray) -> np.ndarray:
    """Per count, the 0-based ranks of p99, p90, p50 (nearest rank: ceil(n * q) - 1, in float
    arithmetic as SQL's quantile_disc)."""
    ranks = np.zeros((len(counts), len(PERCENTILES)), np.int64)
    for j, p in enumerate(reversed(PERCENTILES)):
        ranks[:, j] = [max(math.ceil(n * (p / 100)) - 1, 0) for n in counts.tolist()]
    return ranks


def nearest_rank(values: np.ndarray, q: float) -> int:
    """The value of nearest rank q of a non-empty array (as `nearest_ranks`)."""
    k = max(math.ceil(len(values) * q) - 1, 0)
    return int(np.partition(values, k)[k])


class Measured:
    """The host figures of every node and stage (the heavy part: a pass over the rows, their
    durations grouped and ranked), to which the device time is added before they are said."""

    def __init__(self, table, node: np.ndarray, node_stage: np.ndarray, n_stages: int):
        """`node` per row, `node_stage` per node. One pass sums each node's ranges; a stage's
        sums are its nodes'; the durations are grouped once, by node with a stage's nodes side
        by side, so that a stage's are one slice."""
        n_nodes = len(node_stage)
        self.node, self.node_stage, self.n_stages = node, node_stage, n_stages
        self.sums = np.zeros((n_nodes, 7), np.int64)
        _sums(table.parent, table.start, table.end, node, n_nodes, self.sums)
        slots = np.argsort(node_stage, kind="stable")  # the nodes, a stage's side by side
        slot_of_node = np.empty(n_nodes, np.int64)
        slot_of_node[slots] = np.arange(n_nodes)
        off = np.concatenate([[0], np.cumsum(self.sums[slots, 0])])
        # The durations in 32 bits where the longest fits (every range under 2.1 s): this
        # pass' column as long as the table in half the memory.
        longest = int(self.sums[:, 4].max(initial=0))
        grouped = np.empty(len(node), np.int32 if longest <= np.iinfo(np.int32).max
                           else np.int64)
        _grouped(table.start, table.end, node, slot_of_node, off, grouped)
        self.node_pct = np.zeros((n_nodes, len(PERCENTILES)), np.int64)
        _ranked(grouped, off, nearest_ranks(self.sums[slots, 0]), self.node_pct)
        self.node_pct[slots] = self.node_pct.copy()
        stage_off = off[np.searchsorted(node_stage[slots], np.arange(n_stages + 1))]
        counts = _stage_sums(self.sums, node_stage, n_stages)[:, 0]
        self.stage_pct = np.zeros((n_stages, len(PERCENTILES)), np.int64)
        _ranked(grouped, stage_off, nearest_ranks(counts), self.stage_pct)

    def said(self, device=None) -> tuple[dict[int, dict], dict[int, dict]]:
        """Per node and per stage (only those of some rows), their figures as the reports show
        them; `device` the rows' device time (device.PerRange; None: no device side)."""
        sums = self.sums.copy()
        if device is not None:
            _device_sums(device.rows, device.device, device.kernel, self.node, sums)
        stage_sums = _stage_sums(sums, self.node_stage, self.n_stages)
        with_device = device is not None
        return (_docs(sums, self.node_pct, with_device),
                _docs(stage_sums, self.stage_pct, with_device))


def _stage_sums(sums: np.ndarray, node_stage: np.ndarray, n_stages: int) -> np.ndarray:
    """Each stage's sums from its nodes': counts and times added, min of mins, max of maxes."""
    out = np.zeros((n_stages, 7), np.int64)
    out[:, 3] = np.iinfo(np.int64).max
    out[:, 4] = np.iinfo(np.int64).min
    for j in (0, 1, 2, 5, 6):
        np.add.at(out[:, j], node_stage, sums[:, j])
    np.minimum.at(out[:, 3], node_stage, sums[:, 3])
    np.maximum.at(out[:, 4], node_stage, sums[:, 4])
    return out


def _docs(sums: np.ndarray, pct: np.ndarray, with_device: bool) -> dict[int, dict]:
    out = {}
    for k, ((count, total, self_ns, low, high, dev, ker), (p99, p90, p50)) in enumerate(
            zip(sums.tolist(), pct.tolist())):
        if not count:
            continue
        out[k] = {"count": count, "total_ns": total, "self_ns": self_ns,
                  "mean_ns": (total + count // 2) // count,
                  "p50_ns": p50, "p90_ns": p90, "p99_ns": p99, "min_ns": low, "max_ns": high,
                  "device_ns": dev if with_device else None,
                  "kernel_ns": ker if with_device else None}
    return out
