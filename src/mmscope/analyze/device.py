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
    """Per GPU op: the launching call's thread (the range table's key), start and end; the op's
    start, end, name (into `names`) and stream (into `streams`, "GPU 0 stream 7"). `spans`: a
    torch trace's device span per range row (rows, first, last), None where the ops give it."""

    thread: np.ndarray
    call_start: np.ndarray
    call_end: np.ndarray
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
    as64 = {k: np.asarray(cols[k], np.int64) for k in ("thread", "call_start", "call_end",
                                                        "start", "end")}
    return DeviceWork(**as64, name=np.asarray(cols["name"], np.int32),
                      stream=np.asarray(cols["stream"], np.int32), names=names,
                      streams=streams, source=source, spans=spans)


@dataclass
class PerRange:
    """Per table row: first and last (NONE: no device work), kernel_ns and ops, the children's
    work included; `owner` per op: the innermost range that launched it (-1: none)."""

    first: np.ndarray
    last: np.ndarray
    kernel_ns: np.ndarray
    ops: np.ndarray
    owner: np.ndarray

    @property
    def device_ns(self) -> np.ndarray:
        return np.where(self.first >= 0, self.last - self.first, NONE)


def per_range(table) -> PerRange:
    """Each op given to the innermost range of its call's thread that holds the call (in every
    nesting group of that thread: NVTX domains, push/pop and start/end apart), then summed up the
    parent chains. A range ending on another thread gets none of its own (as nsys leaves it
    out), though its work still counts for the ranges around it."""
    work = table.device
    n = len(table)
    out = PerRange(first=np.full(n, _UNSET, np.int64), last=np.full(n, NONE, np.int64),
                   kernel_ns=np.zeros(n, np.int64), ops=np.zeros(n, np.int64),
                   owner=np.full(len(work), -1, np.int64))
    dur = work.end - work.start
    for rows in _groups(table):
        at = _innermost(table, rows, work)
        has = at >= 0
        out.owner[has & (out.owner < 0)] = at[has & (out.owner < 0)]
        own = at[has]
        np.add.at(out.kernel_ns, own, dur[has])
        np.add.at(out.ops, own, 1)
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


def _groups(table) -> list[np.ndarray]:
    """The rows of each nesting group of ranges (domain and kind) in row order."""
    from mmscope.analyze.table import START_END

    sub = (table.domain_id.astype(np.int64) << 1) | (table.kind == START_END)
    values = np.unique(sub)
    if len(values) == 1:
        return [np.arange(len(table))]
    return [np.flatnonzero(sub == v) for v in values.tolist()]


def _innermost(table, rows: np.ndarray, work: DeviceWork) -> np.ndarray:
    """Per op, the innermost of these rows on its call's thread that holds the call: the last
    range started at or before the call, or the first range up its parent chain that ends at or
    after the call's end (-1: none)."""
    from mmscope.analyze.table import asof

    pos = asof(work.thread, work.call_start, table.thread[rows], table.start[rows])
    at = np.where(pos >= 0, rows[np.maximum(pos, 0)], -1)
    live = np.flatnonzero(at >= 0)
    while len(live):
        r = at[live]
        short = table.end[r] < work.call_end[live]
        live = live[short]
        at[live] = table.parent[at[live]]
        live = live[at[live] >= 0]
    return at


def _extend(first, last, rows, start, end) -> None:
    """first/last of these rows widened to take [start, end] in."""
    np.minimum.at(first, rows, start)
    np.maximum.at(last, rows, end)


def _fold(table, out: PerRange) -> None:
    """Children into parents, deepest first: span, time and ops of a range include its
    children's."""
    has = np.flatnonzero((out.ops > 0) | (out.first != _UNSET))
    if len(has) == 0:
        return
    depth = table.depth[has]
    for d in range(int(depth.max()), 0, -1):
        rows = has[depth == d]
        up = table.parent[rows]
        keep = up >= 0
        rows, up = rows[keep], up[keep]
        np.add.at(out.kernel_ns, up, out.kernel_ns[rows])
        np.add.at(out.ops, up, out.ops[rows])
        spans = out.first[rows] != _UNSET
        _extend(out.first, out.last, up[spans], out.first[rows[spans]], out.last[rows[spans]])
        has = np.union1d(has, up)
        depth = table.depth[has]


def kernels_by_stage(table, work: DeviceWork, owner: np.ndarray, stage_of_row: np.ndarray,
                     top: int = TOP_KERNELS) -> dict[int, list[dict]]:
    """Per stage id, its `top` kernels by time: name, count, total_ns. An op counts under every
    range that holds it (its launcher and the launcher's ancestors), as nsys' nvtx_kern_sum."""
    has = owner >= 0
    if not has.any():
        return {}
    n_names = len(work.names)
    key, inverse = np.unique(owner[has] * n_names + work.name[has], return_inverse=True)
    dur = np.bincount(inverse, weights=(work.end - work.start)[has]).astype(np.int64)
    count = np.bincount(inverse).astype(np.int64)
    rows, name = key // n_names, key % n_names
    parts = []
    while len(rows):
        parts.append((stage_of_row[rows].astype(np.int64) * n_names + name, dur, count))
        rows = table.parent[rows]
        keep = rows >= 0
        rows, name, dur, count = rows[keep], name[keep], dur[keep], count[keep]
    keys = np.concatenate([p[0] for p in parts])
    k, inv = np.unique(keys, return_inverse=True)
    total = np.bincount(inv, weights=np.concatenate([p[1] for p in parts])).astype(np.int64)
    times = np.bincount(inv, weights=np.concatenate([p[2] for p in parts])).astype(np.int64)
    out: dict[int, list[dict]] = {}
    order = np.lexsort((-total, k // n_names))
    for i in order.tolist():
        stage = int(k[i] // n_names)
        got = out.setdefault(stage, [])
        if len(got) < top:
            got.append({"name": work.names[int(k[i] % n_names)], "count": int(times[i]),
                        "total_ns": int(total[i])})
    return out


def streams(work: DeviceWork) -> list[dict]:
    """Per device stream: its name, ops and their summed time."""
    ops = np.bincount(work.stream, minlength=len(work.streams))
    busy = np.bincount(work.stream, weights=work.end - work.start, minlength=len(work.streams))
    return [{"stream": name, "ops": int(ops[i]), "kernel_ns": int(busy[i])}
            for i, name in enumerate(work.streams) if ops[i]]
