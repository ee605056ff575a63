"""The device side of a profile: each GPU op (kernel, memcpy, memset) with the runtime call that
launched it, and per range its device time, as nsys' `nvtx_gpu_proj_trace` projects a range.

A range's GPU work is what the runtime calls made on its thread while it was open launched (its
children's too); `device_ns` runs from the first op's start to the last op's end, `kernel_ns`
adds up the ops' durations (docs/design.md §6). A torch trace states a range's span itself (its
`gpu_user_annotation`): there that span is the range's own, and the fold takes the children's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NONE = -1  # no device work: first and last of a range without ops
_UNSET = np.iinfo(np.int64).max  # first while it is computed: min() takes any start over it
TOP_KERNELS = 5  # the kernels shown under each stage


@dataclass
class DeviceWork:
    """Per GPU op: the launching call's thread (the range table's key) and start; the op's
    start, end, name (into `names`) and stream (into `streams`, "GPU 0 stream 7"). `spans`: a
    torch trace's device span per range row (rows, first, last), None where the ops give it."""

    thread: np.ndarray
    call_start: np.ndarray
    start: np.ndarray
    end: np.ndarray
    name: np.ndarray
    stream: np.ndarray
    names: list[str]
    streams: list[str]
    source: str
    spans: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.start)


def from_columns(cols: dict, names: list[str], streams: list[str], source: str,
                 spans=None) -> DeviceWork:
    as64 = {k: np.asarray(cols[k], np.int64) for k in ("thread", "call_start", "start", "end")}
    return DeviceWork(**as64, name=np.asarray(cols["name"], np.int32),
                      stream=np.asarray(cols["stream"], np.int32), names=names,
                      streams=streams, source=source, spans=spans)


@dataclass
class PerRange:
    """Per table row: first and last (NONE: no device work), kernel_ns and ops, the children's
    work included; `owners`, per nesting group, per op: the innermost range of that group that
    launched it (-1: none)."""

    first: np.ndarray
    last: np.ndarray
    kernel_ns: np.ndarray
    ops: np.ndarray
    owners: list[np.ndarray]

    @property
    def device_ns(self) -> np.ndarray:
        return np.where(self.first >= 0, self.last - self.first, NONE)


def per_range(table) -> PerRange:
    """Each op given to the innermost range of its call's thread open when the call started (in
    every nesting group of that thread: NVTX domains, push/pop and start/end apart; a range on
    the call's thread closes after the calls made in it return), then summed up the parent
    chains. A range ending on another thread gets none of its own (as nsys leaves it
    out), though its work still counts for the ranges around it."""
    work = table.device
    n = len(table)
    out = PerRange(first=np.full(n, _UNSET, np.int64), last=np.full(n, NONE, np.int64),
                   kernel_ns=np.zeros(n, np.int64), ops=np.zeros(n, np.int64), owners=[])
    dur = work.end - work.start
    for rows in _groups(table):
        at = _innermost(table, rows, work)
        out.owners.append(at)
        has = at >= 0
        own = at[has]
        out.kernel_ns += np.bincount(own, weights=dur[has], minlength=n).astype(np.int64)
        out.ops += np.bincount(own, minlength=n)
        if work.spans is None:
            _extend(out.first, out.last, own, work.start[has], work.end[has])
    if work.spans is not None:
        rows, first, last = work.spans
        _extend(out.first, out.last, rows, first, last)
    _fold(table, out)
    none = out.first == _UNSET
    if table.end_thread is not table.thread:
        none |= table.end_thread != table.thread
    out.first[none], out.last[none] = NONE, NONE
    return out


def _groups(table) -> list[np.ndarray | None]:
    """The rows of each nesting group of ranges (domain and kind) in row order (None: all)."""
    from mmscope.analyze.ranges.table import START_END

    sub = (table.domain_id.astype(np.int64) << 1) | (table.kind == START_END)
    values = np.unique(sub)
    if len(values) == 1:
        return [None]
    return [np.flatnonzero(sub == v) for v in values.tolist()]


def _innermost(table, rows: np.ndarray | None, work: DeviceWork) -> np.ndarray:
    """Per op, the innermost of these rows (None: every row) on its call's thread open at the
    call's start: the last range started at or before it, or the first range up its parent
    chain that ends after it (-1: none). The ops of one call mostly lie together: the call is
    looked up once for each run of them."""
    from mmscope.analyze.ranges.table import asof

    head = np.ones(len(work), bool)
    head[1:] = (work.thread[1:] != work.thread[:-1]) | (work.call_start[1:] != work.call_start[:-1])
    heads = np.flatnonzero(head)
    run = np.cumsum(head) - 1
    del head
    right = (table.thread, table.start) if rows is None else (table.thread[rows],
                                                              table.start[rows])
    pos = asof(work.thread[heads], work.call_start[heads], *right)
    at = pos if rows is None else np.where(pos >= 0, rows[np.maximum(pos, 0)], -1)
    call_start = work.call_start[heads]
    live = np.flatnonzero(at >= 0)
    while len(live):
        short = table.end[at[live]] <= call_start[live]
        live = live[short]
        at[live] = table.parent[at[live]]
        live = live[at[live] >= 0]
    return at[run]


def _extend(first, last, rows, start, end) -> None:
    """first/last of these rows widened to take [start, end] in."""
    np.minimum.at(first, rows, start)
    np.maximum.at(last, rows, end)


def _fold(table, out: PerRange) -> None:
    """Children into parents, deepest first: span, time and ops of a range include its
    children's."""
    has = (out.ops > 0) | (out.first != _UNSET)
    if not has.any():
        return
    for d in range(int(table.depth[has].max()), 0, -1):
        rows = np.flatnonzero(has & (table.depth == d))
        up = table.parent[rows]
        keep = up >= 0
        rows, up = rows[keep], up[keep]
        n = len(table)
        out.kernel_ns += np.bincount(up, weights=out.kernel_ns[rows], minlength=n).astype(np.int64)
        out.ops += np.bincount(up, weights=out.ops[rows], minlength=n).astype(np.int64)
        spans = out.first[rows] != _UNSET
        _extend(out.first, out.last, up[spans], out.first[rows[spans]], out.last[rows[spans]])
        has[up] = True


def kernels_by_stage(work: DeviceWork, owners: list[np.ndarray], nodes, node_of_row: np.ndarray,
                     top: int = TOP_KERNELS) -> dict[int, list[dict]]:
    """Per stage id, its `top` kernels by time: name, count, total_ns. An op counts under every
    range that holds it (its launcher and the launcher's ancestors, in each nesting group), as
    nsys' nvtx_kern_sum: under each node of its launcher's path in the stage tree (nodes:
    tree.Nodes)."""
    sums: dict[tuple[int, int], list[int]] = {}
    for owner in owners:
        _add_kernels(sums, work, owner, nodes, node_of_row)
    out: dict[int, list[dict]] = {}
    for (stage, name_id), (t_, c_) in sorted(sums.items(), key=lambda kv: (kv[0][0], -kv[1][0])):
        got = out.setdefault(stage, [])
        if len(got) < top:
            got.append({"name": work.names[name_id], "count": c_, "total_ns": t_})
    return out


def _add_kernels(sums: dict, work: DeviceWork, owner: np.ndarray, nodes,
                 node_of_row: np.ndarray) -> None:
    """(stage, name) -> [time, count] of one nesting group's ops, up their owners' paths."""
    from mmscope.analyze.ranges.tree import _unique

    has = owner >= 0
    if not has.any():
        return
    n_names = len(work.names)
    key = node_of_row[owner[has]].astype(np.int64) * n_names + work.name[has]
    groups, inverse = _unique(key, len(nodes) * n_names)
    del key
    total = np.bincount(inverse, weights=(work.end - work.start)[has]).astype(np.int64)
    count = np.bincount(inverse).astype(np.int64)
    node, name = groups // n_names, groups % n_names
    while len(node):  # up the stage tree: few (node, name) pairs, whatever the ops
        for s_, n_, t_, c_ in zip(nodes.stage[node].tolist(), name.tolist(), total.tolist(),
                                  count.tolist()):
            acc = sums.setdefault((s_, n_), [0, 0])
            acc[0] += t_
            acc[1] += c_
        node = nodes.parent[node]
        keep = node >= 0
        node, name, total, count = node[keep], name[keep], total[keep], count[keep]


def streams(work: DeviceWork) -> list[dict]:
    """Per device stream: its name, ops and their summed time."""
    ops = np.bincount(work.stream, minlength=len(work.streams))
    busy = np.bincount(work.stream, weights=work.end - work.start, minlength=len(work.streams))
    return [{"stream": name, "ops": int(ops[i]), "kernel_ns": int(busy[i])}
            for i, name in enumerate(work.streams) if ops[i]]
