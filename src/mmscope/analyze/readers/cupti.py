"""The device side of an nsys export: its CUPTI tables, each GPU op (kernel, memcpy, memset) joined
to the CUDA runtime or driver call that launched it, as nsys' `nvtx_gpu_proj_trace` joins.

Their integer columns are read in rowid ranges on both cores; the join is on correlationId within
a process (a kernel's globalPid is its call's globalTid without the thread bits), in one compiled
pass; each call's innermost open ranges are found on the range table (device.launch_owners),
and its ops take them.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from mmscope.analyze.ranges import device
from mmscope.analyze.ranges.nesting import dense_codes, sort_segments
from mmscope.analyze.readers import sqlite_source

RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
MEMSET = -1000  # the name code of a memset; a memcpy's is -1 - its copy kind
# Each kind of op: its table and its name code (a kernel's short name: a StringIds id).
OPS = {"CUPTI_ACTIVITY_KIND_KERNEL": "shortName",
       "CUPTI_ACTIVITY_KIND_MEMCPY": "-1 - copyKind",
       "CUPTI_ACTIVITY_KIND_MEMSET": str(MEMSET)}
# CUPTI_ACTIVITY_MEMCPY_KIND, as nsys names the copies.
COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
              8: "DtoD", 9: "HtoH", 10: "PtoP"}
THREAD_BITS = 0xFFFFFF
# Raw columns (NULLs become what `read`'s spec says as they are copied): an expression costs
# SQLite more per row than a column.
CALL = ('SELECT globalTid AS thread, start, correlationId AS c FROM "{table}" '
        "WHERE rowid > {{lo}} AND rowid <= {{hi}}")
OP = ('SELECT start, "end", correlationId AS c, globalPid AS pid, {name} AS name, '
      'deviceId AS device, streamId AS stream FROM "{table}" '
      "WHERE rowid > {{lo}} AND rowid <= {{hi}}")

NO_CUDA = ("no CUDA trace in the export (nsys profile -t cuda,nvtx records the CUPTI runtime, "
           "kernel, memcpy and memset tables)")
RECORDED = "a recording of mmscope record: NVTX ranges on the host, no device side"


def read(con, path: str, tables: set[str], strings, parts: int, table):
    """The DeviceWork of the export on the ranges of `table`, or None and why it has none;
    `strings`: its StringIds (nsys.Strings)."""
    kinds = [t for t in OPS if t in tables]
    if RUNTIME not in tables or not kinds:
        return None, NO_CUDA
    calls = _columns(con, path, [RUNTIME], CALL, parts,
                     {"thread": (np.int64, 0), "start": (np.int64, 0), "c": (np.int64, -1)})
    keys = _CallKeys(calls)
    # Each call's owners: its ops take them (a call launches ops on its thread as it starts).
    owners = device.launch_owners(table, calls.pop("thread"), calls.pop("start"))
    ops = _columns(con, path, kinds, OP, parts,
                   {"start": (np.int64, 0), "end": (np.int64, 0), "c": (np.int64, -1),
                    "pid": (np.int64, 0), "name": (np.int32, MEMSET), "device": (np.int32, 0),
                    "stream": (np.int32, 0)})
    launcher = keys.calls_of(ops)
    del keys
    keep = launcher >= 0
    if not keep.any():
        return None, RECORDED if _recorded(con, tables) else NO_CUDA
    if not keep.all():
        launcher = launcher[keep]
        ops = {k: v[keep] for k, v in ops.items()}
    del keep
    owners = owners[:, launcher]
    del launcher
    name, name_codes = dense_codes(ops.pop("name"))
    stream, stream_codes = dense_codes((ops.pop("device").astype(np.int64) << 32)
                                       | ops.pop("stream"))
    names = [_op_name(int(c), strings) for c in name_codes.tolist()]
    streams = [f"GPU {c >> 32} stream {c & 0xFFFFFFFF}" for c in stream_codes.tolist()]
    return device.DeviceWork(owners=owners, start=ops.pop("start"), end=ops.pop("end"),
                             name=name, stream=stream, names=names, streams=streams,
                             source="nsys CUPTI"), ""


def _columns(con, path: str, tables: list[str], query: str, parts: int, spec: dict) -> dict:
    """The query's integer columns over these tables, one after the other in the same arrays;
    `spec`: per column its dtype and what NULL reads as."""
    sources = [(query.format(table=t, name=OPS.get(t, "")),
                sqlite_source.rowid_ranges(con, f'"{t}"', parts)) for t in tables]
    got = sqlite_source.int_columns(path, sources, [d for d, _ in spec.values()],
                                    [null for _, null in spec.values()])
    return dict(zip(spec, got))


@njit(cache=True, nogil=True)
def _join(call_key, order, op_key, out):
    """out[j]: the call (row) whose key is op j's, -1: none. `order` sorts the calls by key. Ops
    come mostly in key order: each search starts where the last ended."""
    m = len(order)
    at = 0
    for j in range(len(op_key)):
        k = op_key[j]
        steps = 0
        while at < m and call_key[order[at]] < k and steps < 16:
            at += 1
            steps += 1
        if at >= m or call_key[order[at]] < k or (at > 0 and call_key[order[at - 1]] >= k):
            lo, hi = 0, m
            while lo < hi:
                mid = (lo + hi) // 2
                if call_key[order[mid]] < k:
                    lo = mid + 1
                else:
                    hi = mid
            at = lo
        out[j] = order[at] if at < m and call_key[order[at]] == k else -1


@njit(cache=True, nogil=True)
def _known(pid, mask, processes):
    """Whether every pid[j] & mask is one of `processes` (ascending)."""
    for j in range(len(pid)):
        p = np.searchsorted(processes, pid[j] & mask)
        if p >= len(processes) or processes[p] != pid[j] & mask:
            return False
    return True


@njit(cache=True, nogil=True)
def _keys(pid, mask, correlation, processes, out):
    """out[j]: (process index << 40) | correlationId, where `processes` (ascending) holds the
    process of pid[j] & mask; -1 where it does not, or the correlation is NULL (-1). `out` may
    be `correlation` itself."""
    for j in range(len(pid)):
        p = np.searchsorted(processes, pid[j] & mask)
        if p < len(processes) and processes[p] == pid[j] & mask and correlation[j] >= 0:
            out[j] = (p << 40) | (correlation[j] & ((1 << 40) - 1))
        else:
            out[j] = -1


@njit(cache=True, nogil=True)
def _key_order(key, n_processes):
    """The calls sorted by key (stably): counted into their processes (key >> 40; the keys -1
    first), which mostly sorts them (a process' calls come in correlationId order), and sorted
    within a process only where they are not."""
    off = np.zeros(n_processes + 2, np.int64)
    for j in range(len(key)):
        off[(key[j] >> 40) + 2] += 1
    for p in range(n_processes + 1):
        off[p + 1] += off[p]
    at = off[:n_processes + 1].copy()
    order = np.empty(len(key), np.int64)
    for j in range(len(key)):
        b = (key[j] >> 40) + 1
        order[at[b]] = j
        at[b] += 1
    sort_segments(order, off[:n_processes + 2], key)
    return order


class _CallKeys:
    """The runtime calls keyed by (process, correlationId), sorted by key, so that each op
    finds the call that launched it. Consumes the calls' correlation column (its memory holds
    the keys)."""

    def __init__(self, calls: dict):
        thread = calls["thread"]
        step = max(len(thread) // 4096, 1)
        self.processes = np.unique(thread[::step] & ~THREAD_BITS)
        if not _known(thread, ~THREAD_BITS, self.processes):  # a sample missed some
            self.processes = np.unique(thread & ~THREAD_BITS)
        self.key = calls.pop("c")
        _keys(thread, ~THREAD_BITS, self.key, self.processes, self.key)
        self.order = _key_order(self.key, len(self.processes))

    def calls_of(self, ops: dict) -> np.ndarray:
        """Per op, the row of the call with its correlationId in its process (-1: none).
        Consumes the ops' correlation and process columns (the process column's memory holds
        the answer)."""
        op_key, out = ops.pop("c"), ops.pop("pid")
        _keys(out, -1, op_key, self.processes, op_key)
        op_key[op_key < 0] = -2  # never a call's key
        _join(self.key, self.order, op_key, out)
        return out


def _recorded(con, tables: set[str]) -> bool:
    """Written by `mmscope record` (its export product says so)."""
    if "META_DATA_EXPORT" not in tables:
        return False
    rows = sqlite_source.frame(con, "SELECT value FROM META_DATA_EXPORT "
                                    "WHERE name = 'EXPORT_PRODUCT_VERSION'").rows()
    return bool(rows) and str(rows[0][0]).startswith("mmscope record")


def _op_name(code: int, strings) -> str:
    if code == MEMSET:
        return "[CUDA memset]"
    if code < 0:
        return f"[CUDA memcpy {COPY_KINDS.get(-1 - code, -1 - code)}]"
    return strings.get(code, f"kernel {code}")
