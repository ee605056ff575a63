"""The nesting of ranges: each range's parent, depth and partial overlaps, found in one compiled pass
over the rows with a stack per nesting group (thread, domain, kind).

Rows already in nesting order within each group (what profiles write) are taken as they are; only
a group out of order is sorted (docs/design.md §6).
"""
from __future__ import annotations

import numpy as np
from numba import njit

NO_PARENT = -1
_FIRST_TABLE = 1 << 10  # slots of the first hash table of dense_codes; grown when too small
_GOLDEN = -7046029254386353131  # 2**64 / the golden ratio, as a signed 64-bit multiplier


@njit(cache=True, nogil=True)
def _codes(values, slots, codes, found):
    """Dense ids of `values` in first-appearance order through an open-addressing table of
    `slots` (a power of two), the keys in `found`; the number of keys, or -1 where the table
    is too small."""
    mask = slots - 1
    table_keys = np.empty(slots, np.int64)
    table_ids = np.full(slots, -1, np.int64)
    made = 0
    last, last_id = 0, -1
    for i in range(len(values)):
        v = values[i]
        if last_id >= 0 and v == last:
            codes[i] = last_id
            continue
        h = ((v * _GOLDEN) >> 20) & mask
        while table_ids[h] >= 0 and table_keys[h] != v:
            h = (h + 1) & mask
        if table_ids[h] < 0:
            if 2 * (made + 1) > slots:
                return -1
            table_keys[h] = v
            table_ids[h] = made
            found[made] = v
            made += 1
        last, last_id = v, table_ids[h]
        codes[i] = last_id
    return made


def dense_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, keys): keys the distinct values in ascending order, codes[i] the index of values[i]
    in them. One pass without a sort of the rows: profiles have few threads and domains."""
    values = np.ascontiguousarray(values)  # integers of any width
    codes = np.empty(len(values), np.int32 if len(values) < (1 << 31) else np.int64)
    slots = _FIRST_TABLE
    while True:
        found = np.empty(slots // 2, np.int64)
        made = _codes(values, slots, codes, found)
        if made >= 0:
            break
        slots *= 4
    keys = found[:made]
    rank = np.empty(made, code_type(made))
    rank[np.argsort(keys, kind="stable")] = np.arange(made, dtype=rank.dtype)
    small = np.empty(len(values), rank.dtype)
    renumber(codes, rank, small)
    return small, np.sort(keys)


def code_type(n: int):
    """The narrowest signed integer type for codes 0..n-1 (and -1): a profile's threads,
    streams and nesting groups are few, and a byte a row of them is memory the analysis keeps."""
    for kind in (np.int8, np.int16, np.int32):
        if n <= np.iinfo(kind).max:
            return kind
    return np.int64


@njit(cache=True, nogil=True)
def renumber(codes, new, out):
    """out[i] = new[codes[i]] (`out` may be `codes`)."""
    for i in range(len(codes)):
        out[i] = new[codes[i]]


@njit(cache=True, nogil=True)
def _in_order(group, start, end, n_groups):
    """Whether every group's rows come in (start, longest first) order."""
    last_start = np.full(n_groups, np.iinfo(np.int64).min, np.int64)
    last_end = np.zeros(n_groups, np.int64)
    for i in range(len(group)):
        g = group[i]
        s, e = start[i], end[i]
        if s < last_start[g] or (s == last_start[g] and e > last_end[g]):
            return False
        last_start[g] = s
        last_end[g] = e
    return True


@njit(cache=True, nogil=True)
def _stack_pass(order, group, start, end, slack, n_groups, parent, crossing):
    """Rows in `order` (nesting order within each group; walk_of). A row's parent is the last
    earlier row of its group that contains it (its start inside, its end at most `slack`
    past); the group's stack keeps the rows that may still contain a later one: a row that ends
    before another needs is passed over for good, as the later row holds everything it could.
    The largest end passed over says whether the row crosses an earlier one."""
    top = np.full(n_groups, -1, np.int64)
    below = np.empty(len(group), parent.dtype)
    for k in range(len(group)):
        i = nth(order, k)
        g = group[i]
        s, e = start[i], end[i]
        need = max(e - slack, s + 1)
        seen = np.iinfo(np.int64).min
        t = top[g]
        while t >= 0 and end[t] < need:
            if end[t] > seen:
                seen = end[t]
            t = below[t]
        parent[i] = t
        crossing[i] = e != s and seen > s + slack
        below[i] = t
        top[g] = i


@njit(cache=True, nogil=True)
def offsets(labels, n_labels):
    """Where each label's rows start once grouped by label: rows of label g at
    [off[g], off[g + 1]) (a counting sort's first half)."""
    off = np.zeros(n_labels + 1, np.int64)
    for i in range(len(labels)):
        off[labels[i] + 1] += 1
    for g in range(n_labels):
        off[g + 1] += off[g]
    return off


@njit(cache=True, nogil=True)
def by_group(walk, group, n_groups):
    """The rows of each nesting group in nesting order: rows[off[g]:off[g + 1]]."""
    off = offsets(group, n_groups)
    at = off[:n_groups].copy()
    rows = np.empty(len(group), walk.dtype)
    for k in range(len(group)):
        i = nth(walk, k)
        rows[at[group[i]]] = i
        at[group[i]] += 1
    return rows, off


def position_type(n: int):
    """Row positions in 32 bits where they fit: half the memory and bandwidth of int64."""
    return np.int32 if n < (1 << 31) - 1 else np.int64


def nesting_order(group: np.ndarray, start: np.ndarray, end: np.ndarray,
                  n_groups: int) -> np.ndarray | None:
    """None where each group's rows already come in nesting order (start, longest first, row),
    else the rows in that order (a stable sort by group and start, ties by end descending)."""
    if _in_order(group, start, end, n_groups):
        return None
    order = np.lexsort((-end, start, group)).astype(position_type(len(group)), copy=False)
    return order


@njit(cache=True, nogil=True)
def _depths(walk, parent, depth):
    for k in range(len(parent)):
        i = nth(walk, k)
        p = parent[i]
        depth[i] = 0 if p < 0 else depth[p] + 1


def depths(parent: np.ndarray, order: np.ndarray | None) -> np.ndarray:
    """Each row's number of ancestors, walking the rows parents first."""
    depth = np.empty(len(parent), np.int32)
    _depths(walk_of(len(parent), order), parent, depth)
    return depth


def walk_of(n: int, order: np.ndarray | None) -> np.ndarray:
    """The rows in nesting order as the compiled passes take them (`nth`): `order`, or where
    that is None an empty array, which stands for row order without a column of positions."""
    return np.zeros(0, position_type(n)) if order is None else order


@njit(cache=True, nogil=True, inline="always")
def nth(walk, k):
    """The k-th row of a walk in nesting order (walk_of's empty walk: row k)."""
    return walk[k] if len(walk) else k


@njit(cache=True, nogil=True)
def sort_segments(order, off, key):
    """Each segment order[off[b]:off[b + 1]] sorted by key[order] (stably), in place; a segment
    already in order, the common case, is only read."""
    for b in range(len(off) - 1):
        lo, hi = off[b], off[b + 1]
        for k in range(lo + 1, hi):
            if key[order[k]] < key[order[k - 1]]:
                seg = order[lo:hi].copy()
                order[lo:hi] = seg[np.argsort(key[seg], kind="mergesort")]
                break


@njit(cache=True, nogil=True, inline="always")
def seek(key, idx, lo, hi, cur, last, value):
    """The last position in idx[lo:hi] (ascending by key[idx]) whose key is at or before `value`
    (lo - 1: none), searched on from `cur`, the answer for `last`: forward while values come in
    time order, a binary search from the start where one goes back."""
    if value < last:
        a, b = lo, hi
        while a < b:
            m = (a + b) // 2
            if key[idx[m]] <= value:
                a = m + 1
            else:
                b = m
        return a - 1
    while cur + 1 < hi and key[idx[cur + 1]] <= value:
        cur += 1
    return cur


def nest(group: np.ndarray, start: np.ndarray, end: np.ndarray, n_groups: int, slack: int = 0):
    """(parent, crossing rows, order): order is None where the rows are in nesting order
    already, else the rows in it (what later passes that need parents first walk)."""
    n = len(start)
    parent = np.empty(n, position_type(n))
    crossing = np.zeros(n, np.bool_)
    order = nesting_order(group, start, end, n_groups)
    _stack_pass(walk_of(n, order), group, start, end, slack, n_groups, parent, crossing)
    return parent, np.flatnonzero(crossing), order
