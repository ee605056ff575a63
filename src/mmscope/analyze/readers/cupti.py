"""The device side of an nsys export: its CUPTI tables, each GPU op (kernel, memcpy, memset) joined
in SQL to the CUDA runtime or driver call that launched it, as nsys' `nvtx_gpu_proj_trace` joins.

The join is on correlationId within a process (a kernel's globalPid is its call's globalTid
without the thread bits); what lies on which range is decided on the range table (device.py).
"""
from __future__ import annotations

import numpy as np

from mmscope.analyze.ranges import device, sql

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

JOIN = """
SELECT r.globalTid AS thread, r.start AS call_start, o.start, o."end", o.name, o.stream
FROM ({ops}) o
JOIN db.{runtime} r ON r.correlationId = o.correlationId
                   AND (r.globalTid & ~{thread_bits}) = o.globalPid
"""
OP = ('SELECT start, "end", correlationId, globalPid, CAST({name} AS INTEGER) AS name, '
      "CAST(deviceId AS BIGINT) << 32 | streamId AS stream FROM db.{table}")


NO_CUDA = ("no CUDA trace in the export (nsys profile -t cuda,nvtx records the CUPTI runtime, "
           "kernel, memcpy and memset tables)")
RECORDED = "a recording of mmscope record: NVTX ranges on the host, no device side"


def read(con, tables: set[str], strings: dict[int, str]):
    """The DeviceWork of the export, or None and why it has none."""
    kinds = [t for t in OPS if t in tables]
    if RUNTIME not in tables or not kinds:
        return None, NO_CUDA
    ops = " UNION ALL ".join(OP.format(name=OPS[t], table=t) for t in kinds)
    cols = sql.columns(con, JOIN.format(ops=ops, runtime=RUNTIME, thread_bits=THREAD_BITS))
    if len(cols["start"]) == 0:
        return None, RECORDED if _recorded(con, tables) else NO_CUDA
    name_codes, cols["name"] = np.unique(cols["name"], return_inverse=True)
    stream_codes, cols["stream"] = np.unique(cols["stream"], return_inverse=True)
    names = [_op_name(int(c), strings) for c in name_codes.tolist()]
    streams = [f"GPU {c >> 32} stream {c & 0xFFFFFFFF}" for c in stream_codes.tolist()]
    return device.from_columns(cols, names, streams, "nsys CUPTI"), ""


def _recorded(con, tables: set[str]) -> bool:
    """Written by `mmscope record` (its export product says so)."""
    if "META_DATA_EXPORT" not in tables:
        return False
    row = con.execute("SELECT value FROM db.META_DATA_EXPORT "
                      "WHERE name = 'EXPORT_PRODUCT_VERSION'").fetchone()
    return row is not None and str(row[0]).startswith("mmscope record")


def _op_name(code: int, strings: dict[int, str]) -> str:
    if code == MEMSET:
        return "[CUDA memset]"
    if code < 0:
        return f"[CUDA memcpy {COPY_KINDS.get(-1 - code, -1 - code)}]"
    return strings.get(code, f"kernel {code}")
