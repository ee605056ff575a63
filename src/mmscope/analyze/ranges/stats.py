"""The stage tree and the flat stage table as the reports show them: per node and per stage its
figures (figures.py: count, total, self, mean, p50/p90/p99, min, max, device and kernel time), and
each one's share of its parent: its time inside that parent over the parent's whole time.
"""
from __future__ import annotations

import re

from mmscope.analyze.ranges.figures import Measured

FIGURES = ("count", "total_ns", "self_ns", "mean_ns", "p50_ns", "p90_ns", "p99_ns", "min_ns",
           "max_ns", "device_ns", "kernel_ns")


def family_doc(family) -> dict | None:
    """A stage's family as the JSON says it: its pattern and how many distinct names it holds."""
    return None if family is None else {"pattern": family[0], "names": family[1]}


def aggregate(frame) -> tuple[dict[int, dict], dict[int, dict]]:
    """The figures of every node and of every stage, keyed by their ids; device_ns and kernel_ns
    summed over the ranges (None without a device side)."""
    return measure(frame).said(frame.device)


def measure(frame) -> Measured:
    """The host figures of every node and stage, the device time to come (Measured.said)."""
    return Measured(frame.table, frame.nodes.of_row, frame.nodes.stage, len(frame.stages))


def flat(frame, by_node: dict, by_stage: dict, name_filter: str | None = None) -> list[dict]:
    """One row per stage, largest total first: its figures, its usual parent stage (the one
    holding most of its ranges) and its time inside that parent over the parent's whole time."""
    nodes = frame.nodes
    within: dict[tuple[int, int], list[int]] = {}  # (stage, parent stage) -> [ranges, time]
    for k, figures in by_node.items():
        up = int(nodes.parent[k])
        if up < 0:
            continue
        acc = within.setdefault((int(nodes.stage[k]), int(nodes.stage[up])), [0, 0])
        acc[0] += figures["count"]
        acc[1] += figures["total_ns"] - int(nodes.excess[k])
    usual: dict[int, tuple[int, int, int]] = {}
    for (stage, parent), (count, time) in sorted(within.items()):
        if stage not in usual or count > usual[stage][1]:
            usual[stage] = (parent, count, time)
    pattern = re.compile(name_filter) if name_filter else None
    out = []
    for s, figures in by_stage.items():
        name = frame.stages[s]
        if pattern and not pattern.search(name):
            continue
        row = {"name": name, **figures, "parent": None, "share_of_parent": None,
               "in_parent": None, "parent_count": None, "kernels": frame.kernels.get(s, []),
               "family": family_doc(frame.families[s])}
        if s in usual:
            parent, count, time = usual[s]
            whole = by_stage[parent]["total_ns"]
            row.update(parent=frame.stages[parent], in_parent=count,
                       parent_count=by_stage[parent]["count"],
                       share_of_parent=round(time / whole, 6) if whole else None)
        out.append(row)
    out.sort(key=lambda r: (-r["total_ns"], r["name"]))
    return out


def tree(frame, by_node: dict, name_filter: str | None = None) -> list[dict]:
    """The nodes in depth-first order (roles as the frame orders them, children by total, the
    largest first), each with its figures and its share of its parent node's total."""
    nodes = frame.nodes
    children: dict[int, list[int]] = {}
    for k in range(len(nodes)):
        children.setdefault(int(nodes.parent[k]), []).append(k)
    keep = _kept(frame, children, name_filter)
    order: list[int] = []
    stack = sorted(children.get(-1, []), key=lambda k: (-int(nodes.role[k]),
                                                         by_node[k]["total_ns"]))
    while stack:
        k = stack.pop()
        if k not in keep:
            continue
        order.append(k)
        stack += sorted(children.get(k, []), key=lambda c: by_node[c]["total_ns"])
    ids = {k: i for i, k in enumerate(order)}
    out = []
    for k in order:
        up = int(nodes.parent[k])
        figures = by_node[k]
        share = None
        if up >= 0 and by_node[up]["total_ns"]:
            share = round((figures["total_ns"] - int(nodes.excess[k]))
                          / by_node[up]["total_ns"], 6)
        out.append({"id": ids[k], "parent": ids.get(up), "role": frame.roles[nodes.role[k]],
                    "name": frame.stages[nodes.stage[k]], "depth": int(nodes.depth[k]),
                    **figures, "share_of_parent": share,
                    "family": family_doc(frame.families[nodes.stage[k]])})
    return out


def _kept(frame, children: dict[int, list[int]], name_filter: str | None) -> set[int]:
    """Every node, or with a filter the matching nodes and the paths down to them."""
    nodes = frame.nodes
    if not name_filter:
        return set(range(len(nodes)))
    pattern = re.compile(name_filter)
    keep: set[int] = set()
    for k in range(len(nodes)):
        if pattern.search(frame.stages[nodes.stage[k]]):
            while k >= 0 and k not in keep:
                keep.add(k)
                k = int(nodes.parent[k])
    return keep
