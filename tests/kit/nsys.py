"""Write real SQLite files in the nsys export schema for the analyzer tests.

The tables come from the reference DDL (tests/data/nsys-nvtx-min-schema.sql); `old=True` drops the
columns that 2024-era exports lack (eventId, binaryData, ...), as the schema note says to.
"""
from __future__ import annotations

import itertools
import re
import sqlite3
from pathlib import Path

DDL_PATH = Path(__file__).parent.parent / "data" / "nsys-nvtx-min-schema.sql"
PUSH_POP, START_END, MARK, THREAD, DOMAIN_CREATE = 59, 60, 34, 39, 75


def ddl(old: bool = False) -> str:
    text = DDL_PATH.read_text()
    if not old:
        return text
    text = "\n".join(line for line in text.splitlines() if "[new>=2025/26]" not in line)
    return re.sub(r",(\s*(--[^\n]*)?\n\);)", r"\1", text)


def global_tid(pid: int, tid: int, vm: int = 1) -> int:
    """nsys' serialized thread id: <HW:8><VM:8><PID:24><TID:24>."""
    return (vm << 48) | (pid << 24) | tid


class NsysFile:
    """A growing nsys-schema SQLite file; call `close()` (or use `with`) to write it."""

    def __init__(self, path, old: bool = False, nvtx: bool = True, pragmas: tuple[str, ...] = ()):
        self.path = str(path)
        self.old = old
        self.con = sqlite3.connect(self.path)
        for pragma in pragmas:  # before the first table: page size, encoding, vacuum, journal
            self.con.execute(f"PRAGMA {pragma}")
        script = ddl(old)
        if not nvtx:
            script = re.sub(r"CREATE TABLE NVTX_EVENTS \(.*?\n\);", "", script, flags=re.S)
        self.con.executescript(script)
        self._strings: dict[str, int] = {}
        self.vm = 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self.con.commit()
        self.con.close()

    def string(self, value: str) -> int:
        sid = self._strings.get(value)
        if sid is None:
            sid = self._strings[value] = len(self._strings) + 1
            self.con.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (sid, value))
        return sid

    def event(self, event_type: int, name: str | None, start: int, end: int | None, pid: int,
              tid: int, *, registered: bool | None = None, domain: int = 0,
              end_tid: int | None = None) -> int:
        """Insert one NVTX_EVENTS row; the name goes to textId (registered) or text."""
        registered = (not self.old) if registered is None else registered
        text_id = self.string(name) if (registered and name is not None) else None
        text = None if registered else name
        end_gtid = None if end_tid is None else global_tid(pid, end_tid, self.vm)
        cur = self.con.execute(
            "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, endGlobalTid, "
            "textId, domainId) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (start, end, event_type, text, global_tid(pid, tid, self.vm), end_gtid, text_id,
             domain))
        return cur.lastrowid

    def range(self, name: str, start: int, end: int | None, pid: int = 100, tid: int | None = None,
              **kw) -> int:
        return self.event(PUSH_POP, name, start, end, pid, pid if tid is None else tid, **kw)

    def start_end(self, name: str, start: int, end: int | None, pid: int = 100,
                  tid: int | None = None, **kw) -> int:
        return self.event(START_END, name, start, end, pid, pid if tid is None else tid, **kw)

    def mark(self, name: str, t: int, pid: int = 100, tid: int | None = None, **kw) -> int:
        return self.event(MARK, name, t, None, pid, pid if tid is None else tid, **kw)

    def domain(self, domain_id: int, name: str, pid: int = 100, t: int = 0) -> int:
        """A domain-create row (type 75, NULL end): domain ids are per process."""
        return self.event(DOMAIN_CREATE, name, t, None, pid, pid, domain=domain_id)

    def thread_name(self, name: str, pid: int, tid: int, event: bool = False) -> None:
        """Name a thread through the ThreadNames table or, with `event`, an NvtxThread row."""
        if event:
            self.event(THREAD, name, 0, None, pid, tid, registered=False)
        else:
            self.con.execute(
                "INSERT INTO ThreadNames (nameId, priority, globalTid) VALUES (?, ?, ?)",
                (self.string(name), 0, global_tid(pid, tid, self.vm)))

    def process(self, pid: int, name: str) -> None:
        self.con.execute("INSERT INTO PROCESSES (globalPid, pid, name) VALUES (?, ?, ?)",
                         (global_tid(pid, 0, self.vm), pid, name))

    # --- the CUPTI tables: a runtime call, and the ops it launched (same correlationId) -------
    def runtime(self, start: int, end: int, correlation: int, pid: int = 100,
                tid: int | None = None, name: str = "cudaLaunchKernel") -> None:
        self.con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, "
            "correlationId, nameId, returnValue) VALUES (?, ?, 0, ?, ?, ?, 0)",
            (start, end, global_tid(pid, pid if tid is None else tid, self.vm), correlation,
             self.string(name)))

    def kernel(self, start: int, end: int, correlation: int, name: str, pid: int = 100,
               device: int = 0, stream: int = 7) -> None:
        self.con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, "
            "correlationId, globalPid, demangledName, shortName, registersPerThread, gridX, "
            "gridY, gridZ, blockX, blockY, blockZ, staticSharedMemory, dynamicSharedMemory, "
            "localMemoryPerThread, localMemoryTotal, gridId, tensorSizeMinusOneElements) "
            "VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?, 32, 1, 1, 1, 128, 1, 1, 0, 0, 0, 0, 1, '')",
            (start, end, device, stream, correlation, global_tid(pid, 0, self.vm),
             self.string(f"void {name}<float>(float*)"), self.string(name)))

    def memcpy(self, start: int, end: int, correlation: int, copy_kind: int = 1,
               pid: int = 100, device: int = 0, stream: int = 14) -> None:
        self.con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, end, deviceId, contextId, streamId, "
            "correlationId, globalPid, bytes, copyKind) VALUES (?, ?, ?, 1, ?, ?, ?, 4096, ?)",
            (start, end, device, stream, correlation, global_tid(pid, 0, self.vm), copy_kind))

    def memset(self, start: int, end: int, correlation: int, pid: int = 100, device: int = 0,
               stream: int = 7) -> None:
        self.con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET (start, end, deviceId, contextId, streamId, "
            "correlationId, globalPid, value, bytes) VALUES (?, ?, ?, 1, ?, ?, ?, 0, 4096)",
            (start, end, device, stream, correlation, global_tid(pid, 0, self.vm)))


def reserve_bytes(path, n: int) -> None:
    """Create an empty SQLite file whose pages keep `n` bytes at their end (SQLite's
    SQLITE_FCNTL_RESERVE_BYTES, which Python's sqlite3 does not offer; set before any write)."""
    import ctypes
    import ctypes.util

    lib = ctypes.CDLL(ctypes.util.find_library("sqlite3"))
    db = ctypes.c_void_p()
    assert lib.sqlite3_open(str(path).encode(), ctypes.byref(db)) == 0
    try:
        reserve = ctypes.c_int(n)
        assert lib.sqlite3_file_control(db, b"main", 38, ctypes.byref(reserve)) == 0
        assert lib.sqlite3_exec(db, b"CREATE TABLE reserved_probe(a); DROP TABLE reserved_probe",
                                None, None, None) == 0
    finally:
        lib.sqlite3_close(db)


# --- the scripted profile most analyzer tests share ------------------------------------------
API_PID, WORKER_PID = 100, 200
SE_TID, SE_END_TID = 201, 202
LAST_T = 9000  # the profile's last timestamp: where unclosed ranges end


def write_pipeline(f: NsysFile, stages) -> None:
    """An API server and a worker running three steps (encoder, cache hit, encoder).

    Covers per-process domains with the same id, a mark with NULL end, an unclosed range, a
    start/end range ending on another thread, thread names from both sources, and the
    unprefixed `vit_forward` spelling.
    """
    f.process(API_PID, "api_server")
    f.process(WORKER_PID, "EngineCore")
    f.domain(1, "mmscope-api", pid=API_PID)
    f.domain(1, "mmscope-worker", pid=WORKER_PID)
    f.thread_name("api", API_PID, API_PID, event=True)
    f.thread_name("worker-0", WORKER_PID, WORKER_PID)
    f.range(stages.processor_range("apply_hf_processor"), 0, 1000, pid=API_PID)
    f.range(stages.hash_range("pil_image"), 100, 300, pid=API_PID)
    f.mark("request_arrived", 500, pid=API_PID)
    f.range("api domain range", 2000, 2500, pid=API_PID, domain=1)
    w = WORKER_PID
    f.range(stages.step_meta_range(stages.StepShape(8, 0, 8, 1)), 1000, 1000, pid=w)
    f.range(stages.PREPROCESS, 1100, 2100, pid=w)
    f.range(stages.EC_LOAD, 1150, 1200, pid=w)
    f.range("worker domain range", 1150, 1160, pid=w, domain=1)
    f.range("vit_forward", 1200, 1700, pid=w)
    f.range(stages.EC_SAVE, 1700, 1800, pid=w)
    f.mark("cache_probe", 1750, pid=w)
    f.range(stages.GATHER_MM_EMBEDDINGS, 1800, 1900, pid=w)
    f.range(stages.EMBED_INPUT_IDS, 1900, 2000, pid=w)
    f.range(stages.FORWARD, 2200, 3200, pid=w)
    f.start_end("ec transfer", 2500, LAST_T, pid=w, tid=SE_TID, end_tid=SE_END_TID)
    f.range(stages.step_meta_range(stages.StepShape(0, 2, 2, 2)), 4000, 4000, pid=w)
    f.range(stages.PREPROCESS, 4100, 4400, pid=w)
    f.range(stages.EC_LOAD, 4150, 4250, pid=w)
    f.range(stages.GATHER_MM_EMBEDDINGS, 4250, 4350, pid=w)
    f.range(stages.FORWARD, 4500, 5000, pid=w)
    f.range(stages.step_meta_range(stages.StepShape(4, 1, 5, 2)), 6000, 6000, pid=w)
    f.range(stages.PREPROCESS, 6100, 7300, pid=w)
    f.range("vit_forward", 6200, 6900, pid=w)
    f.range(stages.EC_SAVE, 6900, 7000, pid=w)
    f.range(stages.GATHER_MM_EMBEDDINGS, 7000, 7100, pid=w)
    f.range(stages.FORWARD, 7400, 8400, pid=w)
    f.range(stages.POSTPROCESS, 8500, None, pid=w)


def pipeline_file(path, old: bool = False, vm: int = 1, pragmas: tuple[str, ...] = ()) -> str:
    from mmscope import stages

    with NsysFile(path, old=old, pragmas=pragmas) as f:
        f.vm = vm
        write_pipeline(f, stages)
    return str(path)


# --- a profile with known nesting across two processes, for figures computed by hand ---------
# Worker steps: (prefill, decode, reqs), preprocess (start, end), vit_forward inside (or None),
# gather inside (or None), forward (start, end). A last preprocess has no step after it.
NESTED = (((8, 0, 1), (100, 1100), (200, 700), (800, 900), (1200, 2200)),
          ((4, 0, 1), (3100, 3700), (3200, 3550), None, (3800, 4500)),
          ((6, 0, 1), (5100, 5300), None, (5150, 5250), (5400, 6000)),
          ((0, 2, 2), (7100, 7250), None, (7150, 7200), (7300, 7700)),
          ((0, 1, 1), (9100, 9200), None, None, (9300, 9600)))


def nested_file(path, scale: int = 1, gpu: bool = False) -> str:
    """The API server (two hf_processor calls, one holding a hash) and a worker running the
    steps of NESTED, each with its step_meta inside its preprocess; every time times `scale`.
    With `gpu`, each vit_forward launches a `vit_gemm` kernel and each forward a `decode_attn`
    and a memset, each running after its launch for half the range's length."""
    from mmscope import stages

    def at(*times):
        return [t * scale for t in times]

    w = WORKER_PID
    correlations = itertools.count(1)
    with NsysFile(path) as f:
        f.process(API_PID, "api_server")
        f.process(w, "VLLM::Worker")
        f.thread_name("api-main", API_PID, API_PID)
        f.range(stages.processor_range("apply_hf_processor"), *at(0, 400), pid=API_PID)
        f.range(stages.hash_range("pil_image"), *at(50, 150), pid=API_PID)
        f.range(stages.processor_range("apply_hf_processor"), *at(500, 700), pid=API_PID)
        for (p, d, reqs), pre, vit, gather, fwd in NESTED:
            f.range(stages.PREPROCESS, *at(*pre), pid=w)
            meta = stages.step_meta_range(stages.StepShape(p, d, p + d, reqs))
            f.range(meta, *at(pre[0] + 10, pre[0] + 10), pid=w)
            for inner, name in ((vit, stages.VIT_FORWARD), (gather, stages.GATHER_MM_EMBEDDINGS)):
                if inner:
                    f.range(name, *at(*inner), pid=w)
            f.range(stages.FORWARD, *at(*fwd), pid=w)
            if gpu:
                launches = [(vit, "vit_gemm"), (fwd, "decode_attn"), (fwd, None)]
                for k, (span, kernel) in enumerate(l for l in launches if l[0]):
                    corr = next(correlations)
                    s0, s1 = at(*span)
                    f.runtime(s0 + 1 + k, s0 + 2 + k, corr, pid=w)
                    run = (s1 - s0) // 2
                    if kernel:
                        f.kernel(s1, s1 + run, corr, kernel, pid=w)
                    else:
                        f.memset(s1 + run, s1 + run + scale, corr, pid=w)
        f.range(stages.PREPROCESS, *at(11_100, 11_180), pid=w)  # no forward follows: no step
    return str(path)
