"""The stage tree: each range's node is its path of stages under its process' role (as the seed
draws `preprocess` over its children), found in one compiled pass over the rows, parents first.

Nodes are numbered level by level, each level in (parent node, stage) order; each node's figures
are aggregated in figures.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from mmscope.analyze.ranges.nesting import nth, renumber, walk_of
from mmscope.analyze.ranges.table import RangeTable



@dataclass
class Nodes:
    """`of_row[r]`: the node of row r; per node: its parent node (-1: a root), role and stage ids
    and depth; `excess[k]`: time of node k's ranges beyond the lengths of the parents holding
    them (ranges that overlap partly can add up to more than their parent)."""

    of_row: np.ndarray
    parent: np.ndarray
    role: np.ndarray
    stage: np.ndarray
    depth: np.ndarray
    excess: np.ndarray

    def __len__(self) -> int:
        return len(self.parent)


@njit(cache=True, nogil=True)
def _node_pass(walk, parent, name_id, stage_of_name, group, n_subs, role_of_thread, n_stages,
               n_roles, of_row, node_parent, node_stage, node_role):
    """Rows in `walk` (parents before children): a root's node is (its thread's role, stage),
    another's (its parent's node, stage); the nodes' parent, stage and role in creation order.
    Returns how many nodes, or -1 where they outgrow the arrays (the caller gives more room)."""
    room = len(node_parent)
    slots = 4 * room  # a power of two: at most a quarter full
    mask = slots - 1
    keys = np.empty(slots, np.int64)
    ids = np.full(slots, -1, np.int64)
    made = 0
    roots = n_roles * n_stages
    for k in range(len(parent)):
        i = nth(walk, k)
        p = parent[i]
        stage = stage_of_name[name_id[i]]
        if p < 0:
            role = role_of_thread[group[i] // n_subs]
            key = role * n_stages + stage
            up = -1
        else:
            up = of_row[p]
            role = node_role[up]
            key = roots + up * n_stages + stage
        h = ((key * -7046029254386353131) >> 20) & mask
        while ids[h] >= 0 and keys[h] != key:
            h = (h + 1) & mask
        if ids[h] < 0:
            if made == room:
                return -1
            keys[h] = key
            ids[h] = made
            node_parent[made] = up
            node_stage[made] = stage
            node_role[made] = role
            made += 1
        of_row[i] = ids[h]
    return made


def build(table: RangeTable, stage_of_name: np.ndarray, role_of_thread: np.ndarray,
          n_stages: int, n_roles: int) -> Nodes:
    """Nodes of every row: `stage_of_name` per name id, `role_of_thread` per thread index."""
    n = len(table)
    of_row = np.empty(n, np.int32)
    walk = walk_of(n, table.order)
    room = 1 << 12
    while True:
        parent, stage, role = (np.empty(room, np.int64) for _ in range(3))
        made = _node_pass(walk, table.parent, table.name_id, stage_of_name, table.group,
                          table.n_subs, role_of_thread.astype(np.int64), n_stages, n_roles,
                          of_row, parent, stage, role)
        if made >= 0:
            break
        room *= 16
    parent, stage, role = parent[:made], stage[:made], role[:made]
    new, depth = _level_order(parent, stage, role, n_stages)
    parent = np.where(parent >= 0, new[np.maximum(parent, 0)], -1)
    order = np.argsort(new)
    renumber(of_row, new.astype(np.int32), of_row)
    return Nodes(of_row=of_row, parent=parent[order], role=role[order], stage=stage[order],
                 depth=depth[order], excess=_excess(table, of_row, len(new)))


def _level_order(parent: np.ndarray, stage: np.ndarray, role: np.ndarray, n_stages: int):
    """Each node's number level by level, a level in (parent's number, stage) order (roots: (role,
    stage)); and each node's depth."""
    k = len(parent)
    depth = np.zeros(k, np.int64)
    for i in range(k):  # parents are made before their children
        if parent[i] >= 0:
            depth[i] = depth[parent[i]] + 1
    new = np.empty(k, np.int64)
    made = 0
    for d in range(int(depth.max(initial=-1)) + 1):
        at = np.flatnonzero(depth == d)
        above = role[at] if d == 0 else new[parent[at]]
        at = at[np.argsort(above * n_stages + stage[at], kind="stable")]
        new[at] = np.arange(made, made + len(at))
        made += len(at)
    return new, depth


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
