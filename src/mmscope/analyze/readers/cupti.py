"""The device side of an nsys export: its CUPTI tables, each GPU op (kernel, memcpy, memset) joined
to the CUDA runtime or driver call that launched it, as nsys' `nvtx_gpu_proj_trace` joins.

Their integer columns are read in rowid ranges on both cores; the join is on correlationId within
a process (a kernel's globalPid is its call's globalTid without the thread bits), in one compiled
pass; what lies on which range is decided on the range table (ranges/device.py).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from mmscope.analyze.ranges import device
from mmscope.analyze.ranges.nesting import dense_codes
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
CALL = ('SELECT coalesce(globalTid, 0) AS thread, start, coalesce(correlationId, -1) AS c '
        'FROM {table} WHERE rowid > {{lo}} AND rowid <= {{hi}}')
OP = ('SELECT start, "end", coalesce(correlationId, -1) AS c, coalesce(globalPid, 0) AS pid, '
      "{name} AS name, coalesce(deviceId, 0) AS device, coalesce(streamId, 0) AS stream "
      "FROM {table} WHERE rowid > {{lo}} AND rowid <= {{hi}}")

NO_CUDA = ("no CUDA trace in the export (nsys profile -t cuda,nvtx records the CUPTI runtime, "
           "kernel, memcpy and memset tables)")
RECORDED = "a recording of mmscope record: NVTX ranges on the host, no device side"


def read(con, path: str, tables: set[str], strings: dict[int, str], parts: int):
    """The DeviceWork of the export, or None and why it has none."""
    kinds = [t for t in OPS if t in tables]
    if RUNTIME not in tables or not kinds:
        return None, NO_CUDA
    calls = _columns(con, path, RUNTIME, CALL.format(table=RUNTIME), parts,
                     {"thread": 0, "start": 0, "c": -1})
    ops = [_columns(con, path, t, OP.format(table=t, name=OPS[t]), parts,
                    {"start": 0, "end": 0, "c": -1, "pid": 0, "name": MEMSET, "device": 0,
                     "stream": 0}) for t in kinds]
    ops = {k: np.concatenate([o[k] for o in ops]) for k in ops[0]}
    launcher = _launchers(calls, ops)
    keep = launcher >= 0
    if not keep.any():
        return None, RECORDED if _recorded(con, tables) else NO_CUDA
    launcher = launcher[keep]
    name_codes, name = np.unique(ops["name"][keep], return_inverse=True)
    stream_codes, stream = np.unique((ops["device"][keep] << 32) | ops["stream"][keep],
                                     return_inverse=True)
    cols = {"thread": calls["thread"][launcher], "call_start": calls["start"][launcher],
            "start": ops["start"][keep], "end": ops["end"][keep], "name": name,
            "stream": stream}
    names = [_op_name(int(c), strings) for c in name_codes.tolist()]
    streams = [f"GPU {c >> 32} stream {c & 0xFFFFFFFF}" for c in stream_codes.tolist()]
    return device.from_columns(cols, names, streams, "nsys CUPTI"), ""


def _columns(con, path: str, table: str, query: str, parts: int, nulls: dict) -> dict:
    ranges = sqlite_source.rowid_ranges(con, f'"{table}"', parts)
    got = sqlite_source.partitioned(path, query, ranges)
    return {k: sqlite_source.numpy_column(got, k, np.int64, null) for k, null in nulls.items()}


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


def _launchers(calls: dict, ops: dict) -> np.ndarray:
    """Per op, the row of the runtime call with its correlationId in its process (-1: none)."""
    pids = np.concatenate([calls["thread"] & ~THREAD_BITS, ops["pid"]])
    code, _ = dense_codes(pids)
    code = code.astype(np.int64) << 40  # processes apart, correlationIds below 2**40
    n = len(calls["c"])
    call_key = code[:n] | (calls["c"] & ((1 << 40) - 1))
    op_key = code[n:] | (ops["c"] & ((1 << 40) - 1))
    call_key[calls["c"] < 0] = -1
    op_key[ops["c"] < 0] = -2
    # Each process' calls come in correlationId order: sorting by process (a radix sort of
    # small codes) mostly sorts the keys; the full sort only where it did not.
    order = np.argsort(code[:n] >> 40, kind="stable")
    if len(order) > 1 and (np.diff(call_key[order]) < 0).any():
        order = np.argsort(call_key, kind="stable")
    out = np.empty(len(op_key), np.int64)
    _join(call_key, order, op_key, out)
    return out


def _recorded(con, tables: set[str]) -> bool:
    """Written by `mmscope record` (its export product says so)."""
    if "META_DATA_EXPORT" not in tables:
        return False
    rows = sqlite_source.frame(con, "SELECT value FROM META_DATA_EXPORT "
                                    "WHERE name = 'EXPORT_PRODUCT_VERSION'").rows()
    return bool(rows) and str(rows[0][0]).startswith("mmscope record")


def _op_name(code: int, strings: dict[int, str]) -> str:
    if code == MEMSET:
        return "[CUDA memset]"
    if code < 0:
        return f"[CUDA memcpy {COPY_KINDS.get(-1 - code, -1 - code)}]"
    return strings.get(code, f"kernel {code}")
