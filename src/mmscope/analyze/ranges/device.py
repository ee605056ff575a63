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
from numba import njit

from mmscope.analyze.ranges.nesting import nth, position_type, seek, walk_of

NONE = -1  # no device work: first and last of a range without ops
_UNSET = np.iinfo(np.int64).max  # first while it is computed: min() takes any start over it
TOP_KERNELS = 5  # the kernels shown under each stage


@dataclass
class DeviceWork:
    """Per GPU op: `owners[s]`, per nesting group s of the range table, the innermost range of
    that group open on the launching call's thread when the call started (-1: none; launch_owners);
    the op's start, end, name (into `names`) and stream (into `streams`, "GPU 0 stream 7").
    `spans`: a torch trace's device span per range row (rows, first, last), None where the ops
    give it."""

    owners: np.ndarray
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


def from_columns(table, cols: dict, names: list[str], streams: list[str], source: str,
                 spans=None) -> DeviceWork:
    """The DeviceWork of ops given with their launching call's thread and start (`cols`:
    thread, call_start, start, end, name, stream) on the ranges of `table`."""
    owners = launch_owners(table, np.asarray(cols["thread"], np.int64),
                           np.asarray(cols["call_start"], np.int64))
    return DeviceWork(owners=owners, start=np.asarray(cols["start"], np.int64),
                      end=np.asarray(cols["end"], np.int64),
                      name=np.asarray(cols["name"], np.int32),
                      stream=np.asarray(cols["stream"], np.int32), names=names,
                      streams=streams, source=source, spans=spans)


def launch_owners(table, thread: np.ndarray, call_start: np.ndarray) -> np.ndarray:
    """Per nesting group of `table` (its rows), per launching call (its thread's globalTid and
    start, mostly in time order), the innermost range of that group on the call's thread open
    when the call started (-1: none): a range on the call's thread closes after the calls made
    in it return."""
    rows, off = table.rows_by_group()
    owners = np.empty((table.n_subs, len(thread)), position_type(len(table)))
    _owners(thread, table.threads, call_start, rows, off, table.start, table.end, table.parent,
            table.n_subs, owners)
    return owners


@dataclass
class PerRange:
    """The rows that hold device work, ascending (`rows`: those that launched ops, those with a
    device span, and their ancestors), and per row there: `device` (the last op's end less the
    first op's start; NONE: no device work of its own), `kernel` and `op_count`, the children's
    work included; `n`: the table's rows. `device_ns`, `kernel_ns` and `ops` give the
    same per row of the table."""

    rows: np.ndarray
    device: np.ndarray
    kernel: np.ndarray
    op_count: np.ndarray
    n: int

    def _per_row(self, values: np.ndarray, none: int) -> np.ndarray:
        out = np.full(self.n, none, values.dtype)
        out[self.rows] = values
        return out

    @property
    def device_ns(self) -> np.ndarray:
        return self._per_row(self.device, NONE)

    @property
    def kernel_ns(self) -> np.ndarray:
        return self._per_row(self.kernel, 0)

    @property
    def ops(self) -> np.ndarray:
        return self._per_row(self.op_count, 0)

    def device_of(self, rows: np.ndarray) -> np.ndarray:
        """The device time of these rows of the table (NONE: none)."""
        at = np.searchsorted(self.rows, rows)
        hit = np.zeros(len(rows), bool)
        inside = at < len(self.rows)
        hit[inside] = self.rows[at[inside]] == rows[inside]
        out = np.full(len(rows), NONE, np.int64)
        out[hit] = self.device[at[hit]]
        return out


@njit(cache=True, nogil=True)
def _owners(op_thread, threads, call_start, rows, off, start, end, parent, n_subs, owners):
    """owners[s, j]: the innermost range of (domain, kind) pair s on op j's call thread (-1:
    none, or a thread without ranges) open when the call started: the last range of that group
    starting at or before it, or the first up its parent chain ending after it. Ops come
    mostly in time order per thread: each group's search goes on from where the last stopped."""
    n_groups = len(off) - 1
    pos = off[:n_groups] - 1  # per group: the last row starting at or before the last call
    last_call = np.full(n_groups, np.iinfo(np.int64).min, np.int64)
    last_thread, t = -1, -1
    for j in range(len(op_thread)):
        if op_thread[j] != last_thread or j == 0:  # the thread's index, found once per run
            last_thread = op_thread[j]
            t = np.searchsorted(threads, last_thread)
            if t >= len(threads) or threads[t] != last_thread:
                t = -1
        c = call_start[j]
        for s in range(n_subs):
            if t < 0:
                owners[s, j] = -1
                continue
            g = t * n_subs + s
            lo, hi = off[g], off[g + 1]
            pos[g] = seek(start, rows, lo, hi, pos[g], last_call[g], c)
            last_call[g] = c
            r = rows[pos[g]] if pos[g] >= lo else -1
            while r >= 0 and end[r] <= c:
                r = parent[r]
            owners[s, j] = r


@njit(cache=True, nogil=True)
def _held(owners, span_rows, parent, slot):
    """The rows that launched ops or hold a span, and their ancestors, ascending; slot[r] their
    position there (-1 elsewhere: `slot` comes filled with -1)."""
    for s in range(owners.shape[0]):
        for j in range(owners.shape[1]):
            r = owners[s, j]
            while r >= 0 and slot[r] < 0:  # up to the first ancestor already held
                slot[r] = 0
                r = parent[r]
    for j in range(len(span_rows)):
        r = span_rows[j]
        while r >= 0 and slot[r] < 0:
            slot[r] = 0
            r = parent[r]
    count = 0
    for i in range(len(slot)):
        if slot[i] == 0:
            slot[i] = count
            count += 1
    rows = np.empty(count, slot.dtype)
    for i in range(len(slot)):
        if slot[i] >= 0:
            rows[slot[i]] = i
    return rows


@njit(cache=True, nogil=True)
def _project(owners, op_start, op_end, use_ops, walk, parent, slot, first, last, kernel, ops):
    """Each op's time to its owners (in every pair), its span where `use_ops`; then children
    into parents, deepest first (the reverse of nesting order). The sums are per held row
    (slot[row])."""
    for s in range(owners.shape[0]):
        for j in range(owners.shape[1]):
            r = owners[s, j]
            if r < 0:
                continue
            k = slot[r]
            kernel[k] += op_end[j] - op_start[j]
            ops[k] += 1
            if use_ops:
                first[k] = min(first[k], op_start[j])
                last[k] = max(last[k], op_end[j])
    for step in range(len(parent) - 1, -1, -1):
        i = nth(walk, step)
        k = slot[i]
        p = parent[i]
        if k < 0 or p < 0 or (ops[k] == 0 and first[k] == _UNSET):
            continue
        q = slot[p]
        kernel[q] += kernel[k]
        ops[q] += ops[k]
        if first[k] != _UNSET:
            first[q] = min(first[q], first[k])
            last[q] = max(last[q], last[k])


def per_range(table) -> PerRange:
    """Each op given to the innermost range of its call's thread open when the call started (in
    every nesting group of that thread: NVTX domains, push/pop and start/end apart; the work's
    owners), then summed up the parent chains. A range ending on another thread gets none of
    its own (as nsys leaves it out), though its work still counts for the ranges around it."""
    work = table.device
    n = len(table)
    span_rows, span_first, span_last = work.spans or (np.zeros(0, np.int64),) * 3
    slot = np.full(n, -1, position_type(n))
    held = _held(work.owners, span_rows, table.parent, slot)
    first, last = np.full(len(held), _UNSET, np.int64), np.full(len(held), NONE, np.int64)
    kernel, ops = np.zeros(len(held), np.int64), np.zeros(len(held), np.int32)
    if len(span_rows):
        np.minimum.at(first, slot[span_rows], span_first)
        np.maximum.at(last, slot[span_rows], span_last)
    _project(work.owners, work.start, work.end, work.spans is None, walk_of(n, table.order),
             table.parent, slot, first, last, kernel, ops)
    none = first == _UNSET
    elsewhere = slot[table.ends_elsewhere[0]]
    none[elsewhere[elsewhere >= 0]] = True
    del slot
    last -= first  # the span, in place
    last[none] = NONE
    return PerRange(rows=held, device=last, kernel=kernel, op_count=ops, n=n)


def kernels_by_stage(work: DeviceWork, nodes, node_of_row: np.ndarray,
                     top: int = TOP_KERNELS) -> dict[int, list[dict]]:
    """Per stage id, its `top` kernels by time: name, count, total_ns. An op counts under every
    range that holds it (its launcher and the launcher's ancestors, in each nesting group), as
    nsys' nvtx_kern_sum: under each node of its launcher's path in the stage tree (nodes:
    tree.Nodes)."""
    sums: dict[tuple[int, int], list[int]] = {}
    for owner in work.owners:
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
    n_names = len(work.names)
    slots = 1 << 10
    while True:  # the (node, name) pairs are few: a table of them, made larger if they are not
        keys, total, count = (np.full(slots, -1, np.int64), np.zeros(slots, np.int64),
                              np.zeros(slots, np.int64))
        if _pair_sums(owner, node_of_row, work.name, work.start, work.end, n_names, keys,
                      total, count):
            break
        slots *= 4
    held = np.flatnonzero(keys >= 0)
    held = held[np.argsort(keys[held])]
    groups, total, count = keys[held], total[held], count[held]
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


@njit(cache=True, nogil=True)
def _pair_sums(owner, node_of_row, name, start, end, n_names, keys, total, count):
    """Per (owner's node, op name) pair, the ops' time and count, in an open-addressing table
    (keys -1: free); False where the table is too small for the pairs (half full)."""
    mask = len(keys) - 1
    made = 0
    for j in range(len(owner)):
        if owner[j] < 0:
            continue
        key = np.int64(node_of_row[owner[j]]) * n_names + name[j]
        h = ((key * -7046029254386353131) >> 20) & mask
        while keys[h] >= 0 and keys[h] != key:
            h = (h + 1) & mask
        if keys[h] < 0:
            made += 1
            if 2 * made > len(keys):
                return False
            keys[h] = key
        total[h] += end[j] - start[j]
        count[h] += 1
    return True


@njit(cache=True, nogil=True)
def _stream_sums(stream, start, end, ops, busy):
    for j in range(len(stream)):
        ops[stream[j]] += 1
        busy[stream[j]] += end[j] - start[j]


def streams(work: DeviceWork) -> list[dict]:
    """Per device stream: its name, ops and their summed time."""
    ops, busy = np.zeros(len(work.streams), np.int64), np.zeros(len(work.streams), np.int64)
    _stream_sums(work.stream, work.start, work.end, ops, busy)
    return [{"stream": name, "ops": int(ops[i]), "kernel_ns": int(busy[i])}
            for i, name in enumerate(work.streams) if ops[i]]
