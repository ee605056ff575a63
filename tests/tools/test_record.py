"""Tests of `mmscope record`: real NVTX calls (the `nvtx` package, and C through the NVTX headers)
are captured by the injection library and written as an nsys-schema SQLite file, checked row by row.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from mmscope.record import native_library
from mmscope.record import spool as spool_reader

DATA = Path(__file__).parent.parent / "kit" / "nvtx_programs"
PY = sys.executable


@pytest.fixture(scope="module", autouse=True)
def _built():
    assert native_library("_nvtx_inject"), "the injection library is not built: pip install -e ."


def record(out: Path, *command: str, extra=(), env=None, timeout=90) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "mmscope.cli", "record", "-o", str(out), *extra, "--", *command],
                          capture_output=True, text=True, timeout=timeout, env=env)


def rows(db: Path) -> list[dict]:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    sql = ("SELECT e.*, coalesce(s.value, e.text) AS name, (e.globalTid >> 24) & 16777215 AS pid, "
           "e.globalTid & 16777215 AS tid, e.endGlobalTid & 16777215 AS end_tid "
           "FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId ORDER BY e.eventId")
    out = [dict(r) for r in con.execute(sql)]
    con.close()
    return out


def one(rs: list[dict], name: str, **match) -> dict:
    found = [r for r in rs if r["name"] == name and all(r[k] == v for k, v in match.items())]
    assert len(found) == 1, (name, match, found)
    return found[0]


def query(db: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def session_start(db: Path) -> int:
    return int(query(db, "SELECT value FROM META_DATA_EXPORT "
                         "WHERE name = 'MMSCOPE_RECORD_SESSION_START_RAW_NS'")[0][0])


def within(row: dict, bounds: list[int], t0: int) -> None:
    assert bounds[0] - t0 <= row["start"] <= row["end"] <= bounds[1] - t0, (row, bounds, t0)


def test_python_program_is_recorded_exactly(tmp_path):
    db, facts_path = tmp_path / "run.sqlite", tmp_path / "facts.json"
    res = record(db, PY, str(DATA / "nvtx_program.py"), str(facts_path))
    assert res.returncode == 0, res.stderr
    main = json.loads(facts_path.read_text())
    child = json.loads(Path(str(facts_path) + ".child").read_text())
    forked = json.loads(Path(str(facts_path) + ".fork").read_text())
    assert query(db, "PRAGMA integrity_check") == [("ok",)]
    rs, t0 = rows(db), session_start(db)
    pid, tid, wtid = main["pid"], main["tid"], main["worker_tid"]

    assert sorted((r["name"], r["eventType"], r["pid"]) for r in rs) == sorted([
        ("outer", 59, pid), ("inner", 59, pid), ("tick", 34, pid),
        ("mydomain", 75, pid), ("cat-a", 33, pid), ("in-domain", 59, pid),
        ("cross-thread", 60, pid), ("worker-range", 59, pid), ("never-closed", 59, pid),
        ("child-range", 59, child["pid"]),
        # the fork child inherits the domain and category and declares them in its own process
        ("mydomain", 75, forked["pid"]), ("cat-a", 33, forked["pid"]),
        ("fork-child-range", 59, forked["pid"]),
    ])
    outer = one(rs, "outer")
    assert (outer["tid"], outer["domainId"], outer["color"], outer["text"]) == (tid, 0, 0xFF0000, None)
    assert outer["textId"] is not None  # nvtx.annotate registers its messages
    within(outer, main["outer"], t0)
    inner = one(rs, "inner")
    assert outer["start"] <= inner["start"] <= inner["end"] <= outer["end"]
    assert inner["end"] - inner["start"] >= 20_000_000  # it slept 20 ms
    tick = one(rs, "tick")
    assert tick["end"] is None and inner["end"] <= tick["start"] <= outer["end"]

    domain = one(rs, "mydomain", pid=pid)
    dom = domain["domainId"]
    assert dom > 0 and domain["end"] is None and domain["text"] == "mydomain"
    cat = one(rs, "cat-a", pid=pid)
    assert (cat["category"], cat["domainId"], cat["text"]) == (1, dom, "cat-a")
    in_domain = one(rs, "in-domain")
    assert (in_domain["domainId"], in_domain["category"], in_domain["int64Value"]) == (dom, 1, 42)
    within(in_domain, main["in-domain"], t0)

    cross = one(rs, "cross-thread")
    assert (cross["tid"], cross["end_tid"], cross["domainId"]) == (tid, wtid, dom)
    assert cross["rangeId"] is not None
    within(cross, main["cross-thread"], t0)
    worker = one(rs, "worker-range")
    assert worker["tid"] == wtid and worker["endGlobalTid"] is None
    within(worker, main["worker-range"], t0)
    assert one(rs, "never-closed")["end"] is None

    within(one(rs, "child-range"), child["child-range"], t0)
    fork_range = one(rs, "fork-child-range")
    assert fork_range["tid"] == forked["tid"]  # recorded although the child left by os._exit
    within(fork_range, forked["fork-child-range"], t0)
    assert one(rs, "mydomain", pid=forked["pid"])["domainId"] == dom

    procs = query(db, "SELECT globalPid, pid FROM PROCESSES ORDER BY pid")
    assert procs == sorted((1 << 48 | p << 24, p) for p in (pid, child["pid"], forked["pid"]))
    threads = {g & 0xFFFFFF for (g,) in query(db, "SELECT globalTid FROM ThreadNames")}
    assert threads == {tid, wtid, child["tid"], forked["tid"]}
    assert ("EXPORT_SCHEMA_VERSION", "3.28.1") in query(db, "SELECT name, value FROM META_DATA_EXPORT")
    assert (59, "NvtxPushPopRange") in query(db, "SELECT id, name FROM ENUM_NSYS_EVENT_TYPE")
    assert "13 events, 3 processes, 4 threads" in res.stderr


def _compile(tmp_path: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    # The package's own build needs a C compiler (README), so the tests may rely on one too.
    assert cc is not None, "no C compiler (cc or gcc) on PATH"
    exe = tmp_path / "nvtx_c_program"
    subprocess.run([cc, "-O1", f"-I{DATA}", str(DATA / "nvtx_c_program.c"), "-o", str(exe),
                    "-ldl", "-lpthread"], check=True, capture_output=True)
    return exe


def test_c_program_through_the_nvtx_headers(tmp_path):
    exe = _compile(tmp_path)
    db = tmp_path / "c.sqlite"
    res = record(db, str(exe))
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["0", "0", "-1"]  # push level, pop level, pop with nothing open
    rs = rows(db)
    push, wide = one(rs, "c-push"), one(rs, "wide-\u00fc")
    assert push["text"] == "c-push" and push["textId"] is None  # plain messages go in `text`
    assert push["start"] <= wide["start"] <= wide["end"] <= push["end"]
    assert one(rs, "c-mark")["eventType"] == 34
    cat = one(rs, "cat-seven")
    assert (cat["eventType"], cat["category"], cat["domainId"]) == (33, 7, 0)
    main_tid = push["tid"]
    named = {(r["name"], r["tid"]) for r in rs if r["eventType"] == 39}
    ender = one(rs, "c-start-end")["end_tid"]
    assert named == {("c-main", main_tid), ("c-ender", ender)} and ender != main_tid
    dom = one(rs, "cdomain")
    reg = one(rs, "c-registered")
    assert (reg["domainId"], reg["category"], reg["color"], reg["doubleValue"]) == (
        dom["domainId"], 7, 0xFF00FF00, 2.5)
    assert reg["text"] is None and reg["textId"] is not None
    names = dict(query(db, "SELECT t.globalTid & 16777215, s.value FROM ThreadNames t "
                           "JOIN StringIds s ON s.id = t.nameId"))
    assert names == {main_tid: "c-main", ender: "c-ender"}


def test_exit_code_is_passed_through(tmp_path):
    assert record(tmp_path / "a.sqlite", "sh", "-c", "exit 3").returncode == 3
    assert record(tmp_path / "b.sqlite", "sh", "-c", "kill -TERM $$").returncode == 128 + signal.SIGTERM


def test_the_command_runs_in_the_environment_it_was_given(tmp_path):
    """The writer's own settings (plain pages, one BLAS thread) stay in the recorder's process."""
    show = "import json, os; print(json.dumps({k: os.environ.get(k) for k in %r}))" % (
        ["NUMPY_MADVISE_HUGEPAGE", "OPENBLAS_NUM_THREADS", "KEEP_ME"])
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMPY_MADVISE_HUGEPAGE", "OPENBLAS_NUM_THREADS")}
    res = record(tmp_path / "x.sqlite", PY, "-c", show, env={**env, "KEEP_ME": "1"})
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"NUMPY_MADVISE_HUGEPAGE": None, "OPENBLAS_NUM_THREADS": None,
                                      "KEEP_ME": "1"}


def test_missing_command_is_a_one_line_error(tmp_path):
    res = record(tmp_path / "x.sqlite", "no-such-command-mmscope")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == ["mmscope: error: command not found: no-such-command-mmscope"]
    assert not (tmp_path / "x.sqlite").exists()


def test_existing_output_needs_force(tmp_path):
    db = tmp_path / "x.sqlite"
    db.write_text("keep")
    res = record(db, "true")
    assert res.returncode == 2 and "use --force" in res.stderr and db.read_text() == "keep"
    assert record(db, "true", extra=["--force"]).returncode == 0
    assert query(db, "SELECT count(*) FROM NVTX_EVENTS") == [(0,)]


def _wait_for(path: Path, proc: subprocess.Popen, timeout=60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the program never got ready"
        time.sleep(0.02)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_the_recorder_still_writes_the_file(tmp_path, sig):
    db, ready = tmp_path / "s.sqlite", tmp_path / "ready"
    proc = subprocess.Popen([PY, "-m", "mmscope.cli", "record", "-o", str(db), "--", PY,
                             str(DATA / "nvtx_loop.py"), str(ready), "300", "--forever"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(ready, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    rs = rows(db)
    assert sum(r["name"] == "step" and r["end"] is not None for r in rs) == 300
    assert sum(r["name"] == "sub" for r in rs) == 300
    waiting = one(rs, "waiting")
    # SIGINT becomes KeyboardInterrupt, which closes the range; SIGTERM kills the program inside it
    assert (waiting["end"] is None) == (sig == signal.SIGTERM)


def test_records_survive_sigkill(tmp_path):
    from mmscope.record.writer import write_export

    spool, ready = tmp_path / "spool", tmp_path / "ready"
    spool.mkdir()
    env = dict(os.environ, NVTX_INJECTION64_PATH=native_library("_nvtx_inject"),
               MMSCOPE_RECORD_DIR=str(spool), MMSCOPE_RECORD_SEGMENT_RECORDS="64")
    proc = subprocess.Popen([PY, str(DATA / "nvtx_loop.py"), str(ready), "1000", "--forever"], env=env)
    _wait_for(ready, proc)
    proc.kill()
    proc.wait()
    summary = write_export(str(spool), str(tmp_path / "k.sqlite"))
    rs = rows(tmp_path / "k.sqlite")
    assert summary.processes == 1
    assert sum(r["name"] == "step" and r["end"] is not None for r in rs) == 1000
    assert one(rs, "waiting")["end"] is None


def test_rows_are_the_same_whatever_the_window(tmp_path):
    """The writer builds and inserts NVTX_EVENTS a window of rows at a time: windows of a few rows,
    cutting across processes, threads, start/end ranges and payloads, give the same file's rows as
    one window."""
    from mmscope.record.writer import Session, write_export

    spool = tmp_path / "spool"
    spool.mkdir()
    env = dict(os.environ, NVTX_INJECTION64_PATH=native_library("_nvtx_inject"), MMSCOPE_RECORD_DIR=str(spool))
    subprocess.run([PY, str(DATA / "nvtx_program.py"), str(tmp_path / "facts.json")], env=env, check=True,
                   timeout=90)
    session = Session(utc_epoch_ns=1_700_000_000_000_000_000)
    tables = {}
    for window in (1 << 20, 3):
        db = tmp_path / f"w{window}.sqlite"
        summary = write_export(str(spool), str(db), session, window=window)
        names = [n for (n,) in query(db, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        tables[window] = {n: query(db, f"SELECT * FROM {n} ORDER BY rowid") for n in names}
    assert summary.processes == 3 and len(tables[3]["NVTX_EVENTS"]) == summary.events > 3 * 3
    assert tables[3] == tables[1 << 20]


def test_ring_wraps_across_threads_and_late_pops(tmp_path):
    """A tiny ring forces the copier, self-copies and pops of ranges whose record was already
    copied (the outer range stays open across every segment)."""
    db = tmp_path / "w.sqlite"
    env = dict(os.environ, MMSCOPE_RECORD_SEGMENT_RECORDS="16")
    res = record(db, PY, str(DATA / "nvtx_loop.py"), str(tmp_path / "r"), "3000", "--outer",
                 "--threads", "3", env=env)
    assert res.returncode == 0, res.stderr
    rs = rows(db)
    outer = one(rs, "outer")
    by_tid: dict[int, list[dict]] = {}
    for r in rs:
        if r["name"] in ("step", "sub"):
            by_tid.setdefault(r["tid"], []).append(r)
    assert sorted(len(v) for v in by_tid.values()) == [6000, 6000, 6000]
    for tid, ranges in by_tid.items():
        steps = [r for r in ranges if r["name"] == "step"]
        subs = [r for r in ranges if r["name"] == "sub"]
        for step, sub in zip(steps, subs):
            assert step["start"] <= sub["start"] <= sub["end"] <= step["end"]
        if tid == outer["tid"]:
            assert outer["start"] <= steps[0]["start"] and steps[-1]["end"] <= outer["end"]


def test_many_threads(tmp_path):
    db = tmp_path / "t.sqlite"
    env = dict(os.environ, MMSCOPE_RECORD_SEGMENT_RECORDS="16")
    res = record(db, PY, str(DATA / "nvtx_loop.py"), str(tmp_path / "r"), "200", "--threads", "24", env=env)
    assert res.returncode == 0, res.stderr
    counts = query(db, "SELECT globalTid, count(*), sum(end IS NULL) FROM NVTX_EVENTS "
                       "WHERE eventType = 59 GROUP BY globalTid")
    assert len(counts) == 24 and {(c, u) for _, c, u in counts} == {(400, 0)}
    assert len(query(db, "SELECT * FROM ThreadNames")) == 24


def test_short_lived_threads_reuse_rings(tmp_path):
    db = tmp_path / "c.sqlite"
    env = dict(os.environ, MMSCOPE_RECORD_SEGMENT_RECORDS="16")
    res = record(db, PY, str(DATA / "nvtx_churn.py"), "60", "70", env=env)
    assert res.returncode == 0, res.stderr
    per_thread = query(db, "SELECT globalTid, count(*), count(DISTINCT textId) FROM NVTX_EVENTS "
                           "WHERE eventType = 59 GROUP BY globalTid")
    assert len(per_thread) == 60 and {(n, k) for _, n, k in per_thread} == {(70, 1)}


def test_a_recording_has_what_nsys_exports_and_readers_look_up(tmp_path):
    db = tmp_path / "n.sqlite"
    res = record(db, PY, str(DATA / "nvtx_loop.py"), str(tmp_path / "r"), "5")
    assert res.returncode == 0, res.stderr
    meta = dict(query(db, "SELECT name, value FROM META_DATA_EXPORT"))
    assert meta["EXPORT_SCHEMA_VERSION"] == "3.28.1" and meta["EXPORT_PRODUCT_VERSION"].startswith("mmscope record")
    capture = dict(query(db, "SELECT name, value FROM META_DATA_CAPTURE"))
    assert capture["CAPTURE_EVENT_TYPE"] == "NvtxEvents"
    assert capture["PROCESS_0:COMMAND"] == PY and capture["PROCESS_0:ARGUMENT_0"] == str(DATA / "nvtx_loop.py")
    types = {i: (n, label) for i, n, label in query(db, "SELECT id, name, label FROM ENUM_NSYS_EVENT_TYPE")}
    for i, name in [(33, "NvtxCategory"), (34, "NvtxMark"), (39, "NvtxThread"), (59, "NvtxPushPopRange"),
                    (60, "NvtxStartEndRange"), (70, "NvtxtPushPopRange"), (71, "NvtxtStartEndRange"),
                    (75, "NvtxDomainCreate"), (76, "NvtxDomainDestroy")]:
        assert types[i] == (name, name)
    # every event type the file uses is in the enum
    used = {t for (t,) in query(db, "SELECT DISTINCT eventType FROM NVTX_EVENTS")}
    assert used and used <= set(types)
    assert (0, "TRACE_PROCESS_EVENT_CUDA_RUNTIME") in query(db, "SELECT id, name FROM ENUM_NSYS_EVENT_CLASS")

    def columns(table):
        return [(name, decl, notnull) for _, name, decl, notnull, _, _ in query(db, f"PRAGMA table_info({table})")]

    kernel = columns("CUPTI_ACTIVITY_KIND_KERNEL")
    assert kernel[:9] == [("start", "INTEGER", 1), ("end", "INTEGER", 1), ("deviceId", "INTEGER", 1),
                          ("contextId", "INTEGER", 1), ("greenContextId", "INTEGER", 0),
                          ("streamId", "INTEGER", 1), ("correlationId", "INTEGER", 0),
                          ("globalPid", "INTEGER", 0), ("demangledName", "INTEGER", 1)]
    assert kernel[-1] == ("tensorSizeMinusOneElements", "TEXT", 1) and len(kernel) == 40
    runtime = [c[0] for c in columns("CUPTI_ACTIVITY_KIND_RUNTIME")]
    assert runtime == ["start", "end", "eventClass", "globalTid", "correlationId", "nameId",
                       "returnValue", "callchainId"]
    assert {"bytes", "copyKind", "srcKind", "dstKind"} <= {c[0] for c in columns("CUPTI_ACTIVITY_KIND_MEMCPY")}
    assert {"value", "bytes", "memKind"} <= {c[0] for c in columns("CUPTI_ACTIVITY_KIND_MEMSET")}
    assert {"syncType", "eventId"} <= {c[0] for c in columns("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION")}
    for table in ("KERNEL", "RUNTIME", "MEMCPY", "MEMSET", "SYNCHRONIZATION"):
        assert query(db, f"SELECT count(*) FROM CUPTI_ACTIVITY_KIND_{table}") == [(0,)]
    nvtx = columns("NVTX_EVENTS")
    assert nvtx[0] == ("start", "INTEGER", 1) and nvtx[-1] == ("eventId", "INTEGER", 1) and len(nvtx) == 21
    # eventId is the rowid, as in nsys's declaration
    assert query(db, "SELECT count(*) FROM NVTX_EVENTS WHERE eventId != rowid") == [(0,)]


def test_long_names_are_kept_whole(tmp_path):
    """Names longer than a SQLite page go to overflow pages, not cut."""
    db = tmp_path / "long.sqlite"
    code = ("import nvtx\n"
            "with nvtx.annotate('a' * 100_000):\n    pass\n"
            "with nvtx.annotate('\u00fc' * 40_000):\n    pass\n")
    res = record(db, PY, "-c", code)
    assert res.returncode == 0, res.stderr
    names = {r["name"] for r in rows(db) if r["eventType"] == 59}
    assert names == {"a" * 100_000, "\u00fc" * 40_000}
    assert query(db, "PRAGMA integrity_check") == [("ok",)]


@pytest.mark.parametrize("value", ["-5", "-0.1", "nan", "inf", "3601", "1e9", "five"])
def test_linger_out_of_range_is_a_one_line_error(tmp_path, value):
    out = tmp_path / "x.sqlite"
    res = subprocess.run([PY, "-m", "mmscope.cli", "record", "-o", str(out), "--linger", value, "--", "true"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mmscope: error: --linger "), res.stderr
    assert not out.exists()


def test_usage_errors_are_one_line(tmp_path):
    res = subprocess.run([PY, "-m", "mmscope.cli", "record", "-o"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mmscope: error: argument -o/--output"), res.stderr


def _pushes(seqs) -> np.ndarray:
    recs = np.zeros(len(seqs), spool_reader.RECORD)
    recs["kind"], recs["start"] = spool_reader.PUSH, seqs
    return recs


def test_a_full_ring_whose_oldest_record_was_never_copied_keeps_it():
    """The reader skips the ring's slot of seq head - capacity, which the writer may be
    overwriting at the moment the process dies, because that seq is always in a copy then. When no
    complete copy holds it (the ring filled exactly to capacity while the copier lagged, or its copy
    was cut off by the exit), nothing can be writing that slot, and the ring's record is the only
    one left."""
    cap = 8
    # Never copied: seqs 0..7 fill the ring exactly.
    ring = spool_reader._Ring(tid=1, capacity=cap, head=cap, slots=_pushes(range(cap)))
    assert spool_reader._ring_events(ring)["start"].tolist() == list(range(cap))
    # Wrapped once: seqs 8..15 in the ring, a copy of 0..7 done, 8 not yet copied.
    ring = spool_reader._Ring(tid=1, capacity=cap, head=2 * cap, slots=_pushes(range(cap, 2 * cap)),
                       copies=[(0, _pushes(range(cap)))])
    assert spool_reader._ring_events(ring)["start"].tolist() == list(range(2 * cap))
    # Copied: the ring's slot of seq head - capacity may be half overwritten (by seq head, never
    # published); the copy's record is the one read.
    slots = _pushes(range(cap, 2 * cap))
    slots[0]["start"] = 999
    ring = spool_reader._Ring(tid=1, capacity=cap, head=2 * cap, slots=slots,
                       copies=[(0, _pushes(range(cap + 1)))])
    assert spool_reader._ring_events(ring)["start"].tolist() == list(range(2 * cap))


def test_nvtx_backend_through_a_real_nvtx_tool(tmp_path):
    """With a tool attached (mmscope record's NVTX injection), mmscope's tracing spans become
    real NVTX push/pop ranges: names, nesting, zero-duration marks and one track per thread."""
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent("""
        import threading, time
        from mmscope.emit import tracing
        assert tracing.active() == ("nvtx",), tracing.active()
        def work():
            with tracing.span("outer"):
                time.sleep(0.01)
                with tracing.span("inner"):
                    tracing.mark("step_meta: prefill=1 decode=0 total=1 reqs=1")
        work()
        t = threading.Thread(target=work); t.start(); t.join()
    """))
    out = tmp_path / "run.sqlite"
    env = dict(os.environ, MMSCOPE_TRACE="nvtx")
    proc = subprocess.run([sys.executable, "-m", "mmscope.cli", "record", "-o", str(out), "--",
                           sys.executable, str(prog)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    rows = sqlite3.connect(out).execute(
        "SELECT coalesce(e.text, s.value), e.start, e.end, e.globalTid, e.eventType "
        "FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
        "WHERE e.eventType = 59 ORDER BY e.start").fetchall()
    names = [r[0] for r in rows]
    assert names == ["outer", "inner", "step_meta: prefill=1 decode=0 total=1 reqs=1"] * 2
    assert len({r[3] for r in rows}) == 2  # two threads, two tracks
    for i in (0, 3):
        outer, inner, mark = rows[i:i + 3]
        assert outer[1] <= inner[1] <= mark[1] <= mark[2] <= inner[2] <= outer[2]
        assert mark[2] - mark[1] < 1_000_000  # a push and an immediate pop
        assert outer[2] - outer[1] >= 10_000_000
