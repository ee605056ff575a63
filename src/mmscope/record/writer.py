"""Turns the spool files of a recording into one SQLite file in the Nsight Systems export schema.

Rows follow `nsys export --type sqlite`, schema 3.28.1 (docs/design.md §6); times are ns from the session start.
"""
from __future__ import annotations

import ctypes
import datetime as _dt
import itertools
import os
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import adbc_driver_sqlite.dbapi as adbc
import numpy as np
import polars as pl

from mmscope.record import native_library, schema
from mmscope.record.spool import (END, MSG_ASCII, MSG_REGISTERED, MSG_UNICODE, PUSH, START,
                                  Process, read_spool_dir)

VM_ID = 1  # nsys puts the local machine's VM id 1 into bits 48-55 of globalTid/globalPid
NVTX_COLUMNS = ["start", "end", "eventType", "rangeId", "category", "color", "text", "globalTid",
                "endGlobalTid", "textId", "domainId", "uint64Value", "int64Value", "doubleValue",
                "uint32Value", "int32Value", "floatValue", "jsonTextId", "jsonText", "binaryData",
                "eventId"]
REAL_COLUMNS = {"doubleValue", "floatValue"}
# The file is written once by one process and replaced into place only when complete, so
# SQLite's journal and syncing guard nothing here; large pages split the table's b-tree less
# (a tenth of the insert time, measured).
PRAGMAS = ("page_size=65536", "journal_mode=OFF", "synchronous=OFF", "locking_mode=EXCLUSIVE",
           "cache_size=-262144")


@dataclass
class Session:
    """What the recorder knows about the run: its start on CLOCK_MONOTONIC_RAW and on the wall
    clock, (ticks, ns) clock pairs taken around it, and the command it ran."""
    start_ns: int | None = None
    end_ns: int | None = None
    utc_epoch_ns: int | None = None
    pairs: list[tuple[int, int]] = field(default_factory=list)
    tsc: bool = False
    command: list[str] = field(default_factory=list)


@dataclass
class Summary:
    events: int
    processes: int
    threads: int
    path: str
    phases: dict[str, tuple[float, float]] = field(default_factory=dict)  # name: (wall s, CPU s)


class _Phases:
    """Wall and CPU time of each step of writing, for the benchmark's account of where time goes."""

    def __init__(self):
        self.times: dict[str, tuple[float, float]] = {}
        self._last = (time.perf_counter(), time.process_time())

    def done(self, name: str) -> None:
        now = (time.perf_counter(), time.process_time())
        self.times[name] = (now[0] - self._last[0], now[1] - self._last[1])
        self._last = now


def gpid(pid: int) -> int:
    return (VM_ID << 48) | ((pid & 0xFFFFFF) << 24)


# ---- clock ----------------------------------------------------------------------------------------

def clock_pair() -> tuple[int, int, bool]:
    """(ticks, CLOCK_MONOTONIC_RAW ns, ticks-are-TSC) read now through the injection library."""
    path = native_library("_nvtx_inject")
    if path is None:
        ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)
        return ns, ns, False
    lib = ctypes.CDLL(path)
    ticks, ns = ctypes.c_uint64(), ctypes.c_uint64()
    tsc = lib.mmscope_clock_pair(ctypes.byref(ticks), ctypes.byref(ns))
    return ticks.value, ns.value, bool(tsc)


class TickClock:
    """Maps TSC ticks to CLOCK_MONOTONIC_RAW ns by a least-squares line through every pair.

    The kernel derives that clock linearly from the same TSC, so the line is exact up to the
    jitter of the pairs; pairs far apart (session start and end, process start and exit) pin the
    slope to well below a part per million."""

    def __init__(self, pairs: list[tuple[int, int]]):
        pts = sorted(set(pairs))
        if len(pts) < 2 or pts[-1][0] - pts[0][0] < 1_000_000:
            now = clock_pair()
            if now[2]:
                pts.append(now[:2])
        self.t0, self.n0 = pts[0]
        if len(pts) < 2:
            self.slope = 1.0
            return
        dt = np.array([p[0] - self.t0 for p in pts], np.float64)
        dn = np.array([p[1] - self.n0 for p in pts], np.float64)
        self.slope = float((dt * dn).sum() / (dt * dt).sum()) if (dt * dt).sum() else 1.0

    def ns(self, ticks: np.ndarray, t0: int) -> np.ndarray:
        """ns relative to t0; works in place on one float temporary (these arrays are large)."""
        f = (ticks.view(np.int64) - np.int64(self.t0)).astype(np.float64)
        f *= self.slope
        np.rint(f, out=f)
        out = f.astype(np.int64)
        out += np.int64(self.n0 - t0)
        return out


class RawClock:
    def ns(self, ticks: np.ndarray, t0: int) -> np.ndarray:
        return ticks.view(np.int64) - np.int64(t0)


# ---- strings ---------------------------------------------------------------------------------------

class StringPool:
    """Global string table: StringIds ids are index + 1; rows hold indexes (-1 for none)."""

    def __init__(self):
        self.index: dict[str, int] = {}
        self.values: list[str] = []

    def add(self, s: str) -> int:
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.values)
            self.values.append(s)
        return i

    def local_map(self, strings: dict[int, str]) -> np.ndarray:
        """Array mapping a process's string ids to pool indexes (-1 for unknown ids)."""
        lut = np.full(max(strings, default=0) + 1, -1, np.int64)
        for sid, s in strings.items():
            lut[sid] = self.add(s)
        return lut


# ---- rows ------------------------------------------------------------------------------------------

INT32_COLUMNS = {"eventType", "category", "domainId", "textId"}
WINDOW = 1 << 20  # rows a frame: SQLite inserts one window while the next is built


def _dtype(name: str):
    return np.float64 if name in REAL_COLUMNS else np.int32 if name in INT32_COLUMNS else np.int64


def _payload_columns(ev: np.ndarray) -> dict:
    """nsys's six payload columns from the NVTX payload type and the raw 8 bytes."""
    raw, ptype = ev["payload"], ev["ptype"]
    cols = {}
    if not ptype.any():
        return cols
    low = (raw & 0xFFFFFFFF).astype(np.uint32)
    spec = {
        "uint64Value": (1, lambda: raw.view(np.int64)),
        "int64Value": (2, lambda: raw.view(np.int64)),
        "doubleValue": (3, lambda: raw.view(np.float64)),
        "uint32Value": (4, lambda: low.astype(np.int64)),
        "int32Value": (5, lambda: low.view(np.int32).astype(np.int64)),
        "floatValue": (6, lambda: low.view(np.float32).astype(np.float64)),
    }
    for name, (code, value) in spec.items():
        hit = ptype == code
        if hit.any():
            cols[name] = (value(), ~hit)
    return cols


KIND_TO_EVENT_TYPE = np.array([0, 59, 60, 0, 34, 0], np.int32)  # PUSH, START, END, MARK


def _nullable(values: np.ndarray, null: np.ndarray):
    """A column, or None when every row is NULL (the column is then left out)."""
    if null.all():
        return None
    return values, (null if null.any() else None)


def _with_ends(proc: Process):
    """The events without END records, the end ticks of each (0 = none or never ended) and, for
    start/end ranges, the thread that ended them."""
    ev, tids = proc.events, proc.tids
    kind = ev["kind"]
    end_ticks = np.where(kind == PUSH, ev["aux"], np.uint64(0))
    is_end = kind == END
    if not is_end.any():
        return ev, tids, end_ticks, None
    starts = np.flatnonzero(kind == START)
    ts, etid = _join_ends(ev["aux"][starts], ev["aux"][is_end], ev["start"][is_end], tids[is_end])
    end_ticks[starts] = ts
    end_tid = np.zeros(len(ev), np.uint32)
    end_tid[starts] = etid
    keep = ~is_end
    return ev[keep], tids[keep], end_ticks[keep], end_tid[keep]


def _join_ends(rids, end_rids, end_ticks, end_tids):
    """End time and thread of each start/end range (0 where it never ended)."""
    ts = np.zeros(len(rids), np.uint64)
    tid = np.zeros(len(rids), np.uint32)
    if len(rids) and len(end_rids):
        order = np.argsort(end_rids, kind="stable")
        sorted_ids = end_rids[order]
        pos = np.minimum(np.searchsorted(sorted_ids, rids), len(sorted_ids) - 1)
        hit = sorted_ids[pos] == rids
        ts[hit] = end_ticks[order][pos[hit]]
        tid[hit] = end_tids[order][pos[hit]]
    return ts, tid


def _string_table(lut: np.ndarray) -> np.ndarray:
    """Pool indexes by a process's string id, clipped ids included: -1 for 0 (no string) and for
    every id never defined (the slot past the end)."""
    table = np.append(lut, -1)
    table[0] = -1
    return table


class EventRows:
    """One process's events, made into NVTX_EVENTS columns a window of rows at a time."""

    def __init__(self, proc: Process, clock, t0: int, lut: np.ndarray):
        self.ev, self.tids, self.end_ticks, self.end_tid = _with_ends(proc)
        self.clock, self.t0, self.base = clock, t0, np.int64(gpid(proc.pid))
        self.strings = _string_table(lut)
        self.start = clock.ns(self.ev["start"], t0)

    def columns(self, sel: np.ndarray) -> dict:
        """The rows `sel`: name -> (values, NULL mask or None); columns NULL throughout left out."""
        ev, tids, end_ticks = self.ev[sel], self.tids[sel], self.end_ticks[sel]
        kind, msg, category = ev["kind"], ev["msgtype"], ev["category"]
        text_idx = self.strings.take(ev["text"], mode="clip")
        plain = (msg == MSG_ASCII) | (msg == MSG_UNICODE)
        cols = {
            "start": (self.start[sel], None),
            "end": _nullable(self.clock.ns(end_ticks, self.t0), end_ticks == 0),
            "eventType": (KIND_TO_EVENT_TYPE[kind], None),
            "rangeId": _nullable(ev["aux"].view(np.int64), kind != START),
            "category": _nullable(category, category == 0),
            "color": _nullable(ev["color"], ev["colortype"] != 1),
            "text": (np.where(plain, text_idx, -1), None) if plain.any() else None,
            "globalTid": (tids.astype(np.int64) + self.base, None),
            "textId": _nullable(text_idx + 1, (msg != MSG_REGISTERED) | (text_idx < 0)),
            "domainId": (ev["domain"], None),
            **_payload_columns(ev),
        }
        if self.end_tid is not None:
            end_tid = self.end_tid[sel]
            cols["endGlobalTid"] = _nullable(end_tid.astype(np.int64) + self.base,
                                             (end_tid == 0) | (end_tid == tids))
        return cols


class MetaRows:
    """Domain-create (75), category (33) and thread-name (39) rows; names go in `text`."""

    def __init__(self, proc: Process, clock, t0: int, lut: np.ndarray):
        base = gpid(proc.pid)
        rows = [(75, did, 0, sid, tid, tk) for did, sid, tid, tk in proc.domains]
        rows += [(33, dom, cat, sid, tid, tk) for dom, cat, sid, tid, tk in proc.categories]
        rows += [(39, 0, 0, sid, tid, tk) for tid, sid, source, tk in proc.thread_names if source == 1]
        a = np.array(rows, np.int64).reshape(-1, 6)
        self.start = clock.ns(np.array([r[5] for r in rows], np.uint64), t0)
        self.cols = {"start": (self.start, None), "eventType": (a[:, 0], None),
                     "category": _nullable(a[:, 2], a[:, 0] != 33),
                     "text": (_string_table(lut).take(a[:, 3], mode="clip"), None),
                     "globalTid": (base + a[:, 4], None), "domainId": (a[:, 1], None)}

    def columns(self, sel: np.ndarray) -> dict:
        cols = {}
        for name, col in self.cols.items():
            if col is not None:
                values, null = col
                cols[name] = (values[sel], None) if null is None else _nullable(values[sel], null[sel])
        return cols


# ---- tables ----------------------------------------------------------------------------------------

def _column(name: str, values: np.ndarray, null: np.ndarray | None) -> pl.Series:
    series = pl.Series(name, values.astype(_dtype(name), copy=False))
    if null is None:
        return series
    return pl.select(pl.when(pl.Series(~null)).then(series).alias(name)).to_series()


def _text_column(index: np.ndarray, strings: pl.Series) -> pl.Series:
    """Pool indexes to the strings themselves (the `text` column holds unregistered messages)."""
    missing = index < 0
    return strings.gather(_column("text", np.where(missing, 0, index), missing))


def _frame(cols: dict, strings: pl.Series) -> pl.DataFrame:
    return pl.DataFrame([_text_column(c[0], strings) if name == "text" else _column(name, *c)
                         for name in NVTX_COLUMNS if (c := cols.get(name)) is not None])


def _nvtx_frames(rows: _Rows, window: int) -> Iterator[pl.DataFrame]:
    """NVTX_EVENTS in start order, eventId 1..n, a frame for each `window` rows; a column NULL
    throughout a frame is left out of it."""
    strings = pl.Series("text", rows.pool.values, pl.String)
    for first in range(0, len(rows.order), window):
        frame = _window(rows, rows.order[first:first + window], strings)
        event_id = pl.int_range(first + 1, first + 1 + frame.height, dtype=pl.Int64)
        yield frame.with_columns(event_id.alias("eventId"))


def _window(rows: _Rows, idx: np.ndarray, strings: pl.Series) -> pl.DataFrame:
    """The rows `idx` (row numbers of the parts laid end to end), in that order."""
    ends = np.cumsum([len(p.start) for p in rows.parts])
    owner = np.searchsorted(ends, idx, side="right")
    by_part = np.argsort(owner, kind="stable")  # each part's rows of the window, in window order
    cuts = np.cumsum(np.bincount(owner, minlength=len(ends)))[:-1]
    frames = [_frame(part.columns(idx[pos] - (end - len(part.start))), strings)
              for part, pos, end in zip(rows.parts, np.split(by_part, cuts), ends) if len(pos)]
    if len(frames) == 1:
        return frames[0]
    return pl.concat(frames, how="diagonal").gather(np.argsort(by_part))


def _small_tables(rows: _Rows, procs: list[Process], t0_ns: int, session: Session,
                  duration: int) -> dict[str, pl.DataFrame]:
    from mmscope import __version__

    epoch = session.utc_epoch_ns or time.time_ns()
    utc = _dt.datetime.fromtimestamp(epoch / 1e9, _dt.timezone.utc)
    frame = pl.DataFrame
    return {
        "StringIds": frame({"id": np.arange(1, len(rows.pool.values) + 1, dtype=np.int64),
                            "value": pl.Series(rows.pool.values, dtype=pl.String)}),
        "ThreadNames": frame(rows.thread_rows, schema={"nameId": pl.Int64, "globalTid": pl.Int64},
                             orient="row"),
        "PROCESSES": frame([(gpid(p.pid), p.pid, p.comm) for p in procs],
                           schema={"globalPid": pl.Int64, "pid": pl.Int64, "name": pl.String},
                           orient="row"),
        "TARGET_INFO_SESSION_START_TIME": frame({
            "utcEpochNs": [epoch], "utcTime": [utc.isoformat(timespec="milliseconds")],
            "localTime": [utc.astimezone().isoformat(timespec="milliseconds")]}),
        "ANALYSIS_DETAILS": frame({"globalVid": [VM_ID << 48], "duration": [duration],
                                   "startTime": [0], "stopTime": [duration]}),
        "META_DATA_EXPORT": _name_value([
            ("EXPORT_SCHEMA_VERSION", schema.SCHEMA_VERSION),
            ("EXPORT_PRODUCT_VERSION", f"mmscope record {__version__}"),
            ("MMSCOPE_RECORD_VERSION", __version__),
            ("MMSCOPE_RECORD_CLOCK", "CLOCK_MONOTONIC_RAW" + (" via TSC" if any(p.tsc for p in procs) else "")),
            ("MMSCOPE_RECORD_SESSION_START_RAW_NS", str(t0_ns)),
        ]),
        "META_DATA_CAPTURE": _name_value(_capture_rows(session, duration)),
        "ENUM_NSYS_EVENT_TYPE": frame([(i, n, n) for i, n in schema.EVENT_TYPES],
                                      schema=["id", "name", "label"], orient="row"),
        "ENUM_NSYS_EVENT_CLASS": frame(schema.EVENT_CLASSES, schema=["id", "name", "label"], orient="row"),
    }


def _capture_rows(session: Session, duration: int) -> list[tuple[str, str]]:
    """What was captured and how: NVTX only, no sampling, the command that ran."""
    rows = [("CAPTURE_EVENT_TYPE", "NvtxEvents"), ("RATE_HZ", "0"),
            ("COLLECT_THREAD_STATE_TRACE", "false"), ("RUN_DURATION_MS", str(duration // 1_000_000))]
    if session.command:
        rows.append(("PROCESS_0:COMMAND", session.command[0]))
        rows += [(f"PROCESS_0:ARGUMENT_{i}", a) for i, a in enumerate(session.command[1:])]
    return rows


def _name_value(rows: list[tuple[str, str]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={"name": pl.String, "value": pl.String}, orient="row")


def _thread_rows(procs: list[Process], luts: list[np.ndarray]) -> tuple[list[tuple[int, int]], int]:
    """ThreadNames rows: the name a thread was given through NVTX, else its OS name."""
    rows, threads = [], 0
    for proc, lut in zip(procs, luts):
        names: dict[int, tuple[int, int]] = {}
        for tid, sid, source, _ in proc.thread_names:
            if 0 < sid < lut.size and lut[sid] >= 0 and (tid not in names or source >= names[tid][1]):
                names[tid] = (int(lut[sid]) + 1, source)
        seen = set(np.unique(proc.tids).tolist())
        threads += len(seen)
        rows += [(name_id, gpid(proc.pid) | tid) for tid, (name_id, _) in sorted(names.items())]
    return rows, threads


@dataclass
class _Rows:
    parts: list  # EventRows and MetaRows of each process, laid end to end
    order: np.ndarray  # their row numbers in start order (stable: each thread keeps its order)
    last_start: int
    pool: StringPool
    thread_rows: list[tuple[int, int]]
    threads: int


def _clocks(procs: list[Process], session: Session) -> list:
    pairs = list(session.pairs) if session.tsc else []
    for p in procs:
        if p.tsc:
            pairs += p.pairs
    tick_clock = TickClock(pairs) if pairs else None
    return [tick_clock if p.tsc else RawClock() for p in procs]


def _build_rows(procs: list[Process], session: Session, t0: int) -> _Rows:
    """Every row's start and the order they go in; the other columns are made a window at a time."""
    pool, parts, luts = StringPool(), [], []
    for p, clock in zip(procs, _clocks(procs, session)):
        lut = pool.local_map(p.strings)
        luts.append(lut)
        parts += [EventRows(p, clock, t0, lut), MetaRows(p, clock, t0, lut)]
    parts = [p for p in parts if len(p.start)]
    start = np.concatenate([p.start for p in parts]) if parts else np.zeros(0, np.int64)
    order = np.argsort(start, kind="stable")
    thread_rows, threads = _thread_rows(procs, luts)
    last = int(start[order[-1]]) if len(order) else 0
    return _Rows(parts, order, last, pool, thread_rows, threads)


def _write_db(path: str, tables: Iterable[tuple[str, pl.DataFrame]], phases: _Phases) -> None:
    """Creates every table with nsys's own declaration, then appends each frame's rows.

    A second thread inserts each frame while the next one is built: ADBC's ingest runs SQLite
    with the GIL released. The connection is used by one thread at a time."""
    spent = [0.0, 0.0]

    def insert(name: str, frame: pl.DataFrame) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        cur.adbc_ingest(name, frame, mode="append")
        spent[0] += time.perf_counter() - wall
        spent[1] += time.thread_time() - cpu

    with adbc.connect(path, autocommit=True) as con, con.cursor() as cur, \
            ThreadPoolExecutor(1, thread_name_prefix="mmscope-sqlite") as inserter:
        for pragma in PRAGMAS:
            cur.execute(f"PRAGMA {pragma}")
        cur.execute("BEGIN")
        for ddl in schema.ALL_TABLES:
            cur.execute(ddl)
        pending = None
        for name, frame in tables:
            if frame.height:
                if pending is not None:
                    pending.result()
                pending = inserter.submit(insert, name, frame)
        if pending is not None:
            pending.result()
        cur.execute("COMMIT")
    phases.done("rows built and inserted a window at a time")
    phases.times["of which SQLite inserts (ADBC, second thread)"] = tuple(spent)


def write_export(spool_dir: str, out_path: str, session: Session | None = None,
                 window: int = WINDOW) -> Summary:
    """Reads every spool in `spool_dir` and writes `out_path`, replaced only once complete."""
    session, phases = session or Session(), _Phases()
    procs = read_spool_dir(spool_dir)
    phases.done("read spool files")
    t0 = session.start_ns if session.start_ns is not None else min((p.pairs[0][1] for p in procs), default=0)
    rows = _build_rows(procs, session, t0)
    duration = max(0, session.end_ns - t0 if session.end_ns is not None else rows.last_start)
    phases.done("rows in start order (numpy)")
    tables = itertools.chain((("NVTX_EVENTS", f) for f in _nvtx_frames(rows, window)),
                             _small_tables(rows, procs, t0, session, duration).items())
    tmp = out_path + ".tmp"
    try:
        if os.path.exists(tmp):
            os.remove(tmp)
        _write_db(tmp, tables, phases)
        os.replace(tmp, out_path)
    except adbc.Error as e:
        _remove(tmp)
        raise OSError(str(e).splitlines()[0]) from None
    except BaseException:
        _remove(tmp)
        raise
    return Summary(events=len(rows.order), processes=len(procs), threads=rows.threads, path=out_path,
                   phases=phases.times)


def _remove(path: str) -> None:
    if os.path.exists(path):
        os.remove(path)
