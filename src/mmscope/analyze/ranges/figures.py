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
def _sums(parent, start, end, key, n_keys, device_ns, kernel_ns, out):
    """Per key: count, total, self (a range's time less its children's, never below zero), min,
    max, device (over the ranges that launched something) and kernel time; `out` (n_keys, 7)."""
    n = len(start)
    children = np.zeros(n, np.int64)
    for i in range(n):
        p = parent[i]
        if p >= 0:
            children[p] += end[i] - start[i]
    for k in range(n_keys):
        out[k, 3] = np.iinfo(np.int64).max
        out[k, 4] = np.iinfo(np.int64).min
    with_device = len(device_ns) == n
    for i in range(n):
        d = end[i] - start[i]
        k = key[i]
        out[k, 0] += 1
        out[k, 1] += d
        out[k, 2] += d - min(children[i], d)
        out[k, 3] = min(out[k, 3], d)
        out[k, 4] = max(out[k, 4], d)
        if with_device:
            if device_ns[i] >= 0:
                out[k, 5] += device_ns[i]
            out[k, 6] += kernel_ns[i]


@njit(cache=True, nogil=True)
def _select(a, lo, hi, k):
    """a[k] as if a[lo:hi + 1] were sorted, moving its values in place (quickselect, three-way
    around a median of three, so that runs of equal durations cost one round)."""
    while hi > lo:
        x, y, z = a[lo], a[(lo + hi) // 2], a[hi]
        pivot = max(min(x, y), min(max(x, y), z))
        lt, i, gt = lo, lo, hi
        while i <= gt:
            v = a[i]
            if v < pivot:
                a[i] = a[lt]
                a[lt] = v
                lt += 1
                i += 1
            elif v > pivot:
                a[i] = a[gt]
                a[gt] = v
                gt -= 1
            else:
                i += 1
        if k < lt:
            hi = lt - 1
        elif k > gt:
            lo = gt + 1
        else:
            return a[k]
    return a[k]


@njit(cache=True, nogil=True)
def _quantiles(start, end, key, n_keys, ranks, out):
    """Per key the durations of rank ranks[key, j] (0-based, ranks descending per key) into
    out[key, j]: the durations grouped by key, then selected in place."""
    count = offsets(key, n_keys)
    at = count[:n_keys].copy()
    grouped = np.empty(len(key), np.int64)
    for i in range(len(key)):
        k = key[i]
        grouped[at[k]] = end[i] - start[i]
        at[k] += 1
    for k in range(n_keys):
        lo, hi = count[k], count[k + 1] - 1
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


def figures(table, key: np.ndarray, n_keys: int, device_ns=None, kernel_ns=None) -> dict[int, dict]:
    """Per key (only the keys of some rows), its figures as the reports show them."""
    sums = np.zeros((n_keys, 7), np.int64)
    none = np.zeros(0, np.int64)
    _sums(table.parent, table.start, table.end, key, n_keys,
          none if device_ns is None else device_ns, none if kernel_ns is None else kernel_ns,
          sums)
    ranks = nearest_ranks(sums[:, 0])
    pct = np.zeros((n_keys, len(PERCENTILES)), np.int64)
    _quantiles(table.start, table.end, key, n_keys, ranks, pct)
    out = {}
    for k, (count, total, self_ns, low, high, dev, ker) in enumerate(sums.tolist()):
        if not count:
            continue
        p99, p90, p50 = pct[k].tolist()
        out[k] = {"count": count, "total_ns": total, "self_ns": self_ns,
                  "mean_ns": (total + count // 2) // count,
                  "p50_ns": p50, "p90_ns": p90, "p99_ns": p99, "min_ns": low, "max_ns": high,
                  "device_ns": None if device_ns is None else dev,
                  "kernel_ns": None if kernel_ns is None else ker}
    return out
