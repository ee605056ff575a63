"""The stage tree: each range's node is its path of stages under its process' role (as the seed
draws `preprocess` over its children), and each one's self time, as nsys' DurNonChild.

Per range in numpy (the nesting's columns); per node aggregated in SQL (stats).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mmscope.analyze.ranges.table import RangeTable


@dataclass
class Nodes:
    """`of_row[r]`: the node of row r; per node: its
    parent node (-1: a root), role and stage ids and depth; `excess[k]`: time of node k's ranges
    beyond the lengths of the parents holding them (ranges that overlap partly can add up to
    more than their parent)."""

    of_row: np.ndarray
    parent: np.ndarray
    role: np.ndarray
    stage: np.ndarray
    depth: np.ndarray
    excess: np.ndarray

    def __len__(self) -> int:
        return len(self.parent)


def build(table: RangeTable, stage_of_row: np.ndarray, role_of_row: np.ndarray,
          n_stages: int) -> Nodes:
    """Nodes level by level: a root is (role, stage), a node below is (parent node, stage).
    `stage_of_row`, `role_of_row`: per row."""
    of_row = np.full(len(table), -1, np.int32)
    parts = {"parent": [], "role": [], "stage": [], "depth": []}
    order = np.argsort(table.depth, kind="stable").astype(np.int32 if len(table) < 1 << 31
                                                           else np.int64)
    bounds = np.searchsorted(table.depth[order], np.arange(int(table.depth.max(initial=0)) + 2))
    made = 0
    for depth in range(len(bounds) - 1):
        at = order[bounds[depth]:bounds[depth + 1]]
        above = role_of_row[at] if depth == 0 else of_row[table.parent[at]]
        key = above.astype(np.int64) * n_stages + stage_of_row[at]
        uniq, inverse = _unique(key, (int(above.max()) + 1) * n_stages)
        of_row[at] = inverse + made
        up = uniq // n_stages
        parts["parent"].append(np.full(len(uniq), -1) if depth == 0 else up)
        parts["role"].append(up if depth == 0 else np.concatenate(parts["role"])[up])
        parts["stage"].append(uniq % n_stages)
        parts["depth"].append(np.full(len(uniq), depth))
        made += len(uniq)
    cols = {k: (np.concatenate(v) if v else np.zeros(0, np.int64)) for k, v in parts.items()}
    return Nodes(of_row=of_row, excess=_excess(table, of_row, made), **cols)


def _unique(key: np.ndarray, space: int):
    """np.unique(key, return_inverse=True) for keys below `space`: a table of the keys present
    where that is small (no sort of millions of rows), else np.unique."""
    if space > max(4 * len(key), 1 << 16):
        return np.unique(key, return_inverse=True)
    present = np.zeros(space, bool)
    present[key] = True
    uniq = np.flatnonzero(present)
    slot = np.cumsum(present, dtype=np.int64) - 1
    return uniq, slot[key]


def self_times(table: RangeTable) -> np.ndarray:
    """Each range's time less its children's, never below zero (children that overlap partly
    count at most their parent's length)."""
    dur = table.end - table.start
    has = np.flatnonzero(table.parent >= 0)
    # float64 adds integer nanoseconds exactly below 2**53 ns (104 days) a parent.
    children = np.bincount(table.parent[has], weights=dur[has], minlength=len(table))
    del has
    np.minimum(children, dur, out=children)
    np.subtract(dur, children, out=dur, casting="unsafe")  # exact: integers below 2**53
    return dur


def _excess(table: RangeTable, of_row: np.ndarray, n_nodes: int) -> np.ndarray:
    """Per node, what its ranges add beyond the length of the parent range holding them. Only
    children of a parent with a crossing child can overlap, so only those are summed."""
    excess = np.zeros(n_nodes, np.int64)
    parents = np.unique(table.parent[table.crossing])
    parents = parents[parents >= 0]
    if len(parents) == 0:
        return excess
    rows = np.flatnonzero(np.isin(table.parent, parents))
    key = of_row[rows].astype(np.int64) * len(table) + table.parent[rows]
    uniq, inverse = np.unique(key, return_inverse=True)
    inside = np.bincount(inverse, weights=table.end[rows] - table.start[rows]).astype(np.int64)
    parent = uniq % len(table)
    over = np.maximum(inside - (table.end[parent] - table.start[parent]), 0)
    np.add.at(excess, uniq // len(table), over)
    return excess
