"""Benchmark of `mmscope analyze` on a large nsys-schema SQLite file (docs/design.md §8).

Generates N NVTX rows and the CUPTI tables of their GPU work (cached in /tmp) and times, side by
side in one run, each in a fresh process: the floors (SQLite's own `SELECT count(*),
sum(end-start)`, DuckDB's `count(*)` over its SQLite scanner, DuckDB reading the analyzer's NVTX
columns and joining its CUPTI columns without handing a row to Python), the whole
`mmscope analyze FILE --json` (first run with an empty analysis cache, second run answered from
it, and --no-cache), its phases one by one, and a peer tool's NVTX summary of the same file, first
run, second run and direct mode (nsys-ai from PyPI, in its own virtual environment under /tmp,
which this script creates when it is missing).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from mmscope import stages

REPO = Path(__file__).resolve().parent.parent
DDL = REPO / "tests" / "data" / "nsys-nvtx-min-schema.sql"
PUSH_POP, MARK = 59, 34
# The bare scan: SQLite alone, one row back.
BARE_SQL = "SELECT count(*), sum(end-start) FROM NVTX_EVENTS"
# The analyzer's columns of every row, as its reader asks DuckDB's scanner for them.
SCAN_COLUMNS = ('start, "end", globalTid, textId, eventType, domainId, endGlobalTid, '
                "text IS NOT NULL")

# One worker step after its step_meta: (name, start offset, duration) in ns, all scaled per step.
# The preprocess children are an encoder run (load, vit_forward, save) or a cache hit (load,
# prepare); forward time grows with the step's tokens.
ENCODER_STEP = ((stages.PREPROCESS, 0, 40_000), (stages.EC_LOAD, 1_000, 1_000),
                (stages.VIT_FORWARD, 3_000, 20_000), (stages.EC_SAVE, 24_000, 5_000),
                (stages.GATHER_MM_EMBEDDINGS, 30_000, 4_000),
                (stages.EMBED_INPUT_IDS, 35_000, 3_000))
HIT_STEP = ((stages.PREPROCESS, 0, 20_000), (stages.EC_LOAD, 1_000, 3_000),
            (stages.PREPARE_MM_INPUTS, 5_000, 2_000), (stages.EC_LOAD, 8_000, 1_000),
            (stages.GATHER_MM_EMBEDDINGS, 10_000, 4_000), (stages.EMBED_INPUT_IDS, 15_000, 3_000))
ROWS_PER_STEP = 9  # step_meta + 6 preprocess rows + forward + postprocess
# The device side, per step (CUPTI tables, as `nsys profile -t cuda,nvtx` writes them): an
# encoder step's vit_forward launches two kernels; every forward replays a CUDA graph of four;
# embed copies its ids to the device; postprocess synchronises (a call that launches nothing).
VIT_KERNELS, GRAPH_KERNELS = ("vit_attn", "vit_mlp"), ("gemm_qkv", "attn", "gemm_out", "sample")
CUDA_CALLS = ("cudaLaunchKernel", "cudaGraphLaunch", "cudaMemcpyAsync", "cudaStreamSynchronize")
STEP_PERIOD = 200_000
FORWARD_BASE, FORWARD_PER_TOKEN = 20_000, 10
WORKER_PIDS = (2001, 2002, 2003, 2004)
NVTX_ONLY_PIDS = tuple(range(3001, 3009))


def _step_rows(n_steps: int, rng: np.random.Generator):
    """Columns (start, end, name index), step by step, and each step's (prefill, decode)."""
    names = [None] + sorted({n for n, _, _ in ENCODER_STEP + HIT_STEP}
                            | {stages.FORWARD, stages.POSTPROCESS})
    index = {n: i for i, n in enumerate(names)}
    enc = rng.random(n_steps) < 0.4
    base = np.arange(n_steps, dtype=np.int64) * STEP_PERIOD
    scale = rng.uniform(0.8, 1.2, n_steps)
    prefill = np.where(rng.random(n_steps) < 0.3, rng.integers(1, 4096, n_steps), 0)
    decode = rng.integers(0, 256, n_steps)
    starts, ends, ids = [base], [base], [np.zeros(n_steps, np.int64)]  # the step_meta slot
    for (n_e, s_e, d_e), (n_h, s_h, d_h) in zip(ENCODER_STEP, HIT_STEP):
        off = (np.where(enc, s_e, s_h) * scale).astype(np.int64)
        dur = (np.where(enc, d_e, d_h) * scale).astype(np.int64)
        starts.append(base + 1_000 + off)
        ends.append(base + 1_000 + off + dur)
        ids.append(np.where(enc, index[n_e], index[n_h]))
    fwd_start = base + 1_000 + (np.where(enc, 42_000, 22_000) * scale).astype(np.int64)
    fwd_end = fwd_start + FORWARD_BASE + FORWARD_PER_TOKEN * (prefill + decode)
    starts += [fwd_start, fwd_end + 1_000]
    ends += [fwd_end, fwd_end + 5_000]
    ids += [np.full(n_steps, index[stages.FORWARD]), np.full(n_steps, index[stages.POSTPROCESS])]
    cols = [np.stack(c, 1).ravel() for c in (starts, ends, ids)]
    gpu = _gpu_work(base, enc, scale, starts, ends)
    return (*cols, names, prefill, decode, gpu)


def _gpu_work(base, enc, scale, starts, ends) -> dict:
    """Per CUDA call: its step, start, end and call name; per op: its call, start, end, name
    (None: a memcpy). Times in the step's ranges, as _step_rows lays them out."""
    vit, embed = starts[1 + 2], starts[1 + 5]  # the encoder step's vit_forward; embed_input_ids
    fwd, fwd_end, post = starts[-2], ends[-2], starts[-1]
    steps = np.arange(len(base))
    e = np.flatnonzero(enc)
    calls = [  # (steps, start, duration, call name)
        (e, vit[e] + (1_000 * scale[e]).astype(np.int64), 500, CUDA_CALLS[0]),
        (e, vit[e] + (5_000 * scale[e]).astype(np.int64), 500, CUDA_CALLS[0]),
        (steps, fwd + 1_000, 2_000, CUDA_CALLS[1]),
        (steps, embed + 500, 500, CUDA_CALLS[2]),
        (steps, post + 1_000, 2_000, CUDA_CALLS[3])]
    run = (fwd_end - fwd) // 5
    ops = [  # (call index, start offset after the call, duration, name)
        (0, 2_000, (8_000 * scale[e]).astype(np.int64), VIT_KERNELS[0]),
        (1, 6_000, (8_000 * scale[e]).astype(np.int64), VIT_KERNELS[1]),
        *((2, 3_000 + k * run, run, name) for k, name in enumerate(GRAPH_KERNELS)),
        (3, 1_000, 1_000, None)]
    out = {"call_step": [], "call_start": [], "call_end": [], "call_name": [], "op_call": [],
           "op_start": [], "op_end": [], "op_name": []}
    first_call = 0
    firsts = []
    for at, start, dur, name in calls:
        firsts.append(first_call)
        out["call_step"].append(at)
        out["call_start"].append(start)
        out["call_end"].append(start + dur)
        out["call_name"].append(np.full(len(at), CUDA_CALLS.index(name)))
        first_call += len(at)
    for which, offset, dur, name in ops:
        at, start = calls[which][0], out["call_start"][which]
        out["op_call"].append(firsts[which] + np.arange(len(at)))
        out["op_start"].append(start + offset)
        out["op_end"].append(start + offset + dur)  # dur: one, or one per call
        out["op_name"].append(np.full(len(at), -1 if name is None else
                                      (VIT_KERNELS + GRAPH_KERNELS).index(name)))
    return {k: np.concatenate(v) for k, v in out.items()}


def generate(path: Path, rows: int, seed: int = 0, gpu: bool = True) -> None:
    """Write about `rows` NVTX rows in the new nsys schema (textId + StringIds, eventId); with
    `gpu`, the CUPTI tables of their GPU work (four worker processes), else NVTX only (eight)."""
    rng = np.random.default_rng(seed)
    pids = WORKER_PIDS if gpu else NVTX_ONLY_PIDS
    n_steps = max(rows // ROWS_PER_STEP, 1)
    start, end, name_idx, names, prefill, decode, work = _step_rows(n_steps, rng)
    con = sqlite3.connect(path)
    con.executescript("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;" + DDL.read_text())
    shapes = sorted(set(zip(prefill.tolist(), decode.tolist())))
    strings = [(i + 1, n) for i, n in enumerate(names[1:])]
    meta_id = {sh: len(strings) + 1 + i for i, sh in enumerate(shapes)}
    strings += [(meta_id[(p, d)], stages.step_meta_range(stages.StepShape(p, d, p + d, 1)))
                for p, d in shapes]
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", strings)
    text_id = name_idx.copy()
    text_id[name_idx == 0] = [meta_id[sh] for sh in zip(prefill.tolist(), decode.tolist())]
    # Steps are dealt round-robin to the worker processes, each on its main thread (tid == pid).
    pid = np.repeat(np.array(pids, np.int64)[np.arange(n_steps) % len(pids)], ROWS_PER_STEP)
    gtid = (1 << 48) | (pid << 24) | pid
    order = np.argsort(start, kind="stable")  # nsys writes rows roughly in time order
    cols = [start[order], end[order], gtid[order], text_id[order]]
    con.executemany(
        "INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, textId, domainId) "
        f"VALUES (?, ?, {PUSH_POP}, ?, ?, 0)", zip(*(c.tolist() for c in cols)))
    if gpu:
        step_pid = np.array(pids, np.int64)[np.arange(n_steps) % len(pids)]
        _write_gpu_work(con, work, step_pid, len(strings) + 1)
    con.commit()
    con.close()


def _write_gpu_work(con, gpu: dict, step_pid: np.ndarray, first_string: int) -> None:
    """The CUPTI runtime, kernel and memcpy rows, in time order; one correlationId per call."""
    names = CUDA_CALLS + VIT_KERNELS + GRAPH_KERNELS
    con.executemany("INSERT INTO StringIds VALUES (?, ?)",
                    [(first_string + i, n) for i, n in enumerate(names)])
    pid = step_pid[gpu["call_step"]]
    gtid = (1 << 48) | (pid << 24) | pid
    order = np.argsort(gpu["call_start"], kind="stable")
    correlation = np.empty(len(order), np.int64)
    correlation[order] = np.arange(1, len(order) + 1)
    con.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, "
        "correlationId, nameId, returnValue) VALUES (?, ?, 0, ?, ?, ?, 0)",
        zip(*(c.tolist() for c in (gpu["call_start"][order], gpu["call_end"][order],
                                   gtid[order], correlation[order],
                                   first_string + gpu["call_name"][order]))))
    call = gpu["op_call"]
    cols = [gpu["op_start"], gpu["op_end"], correlation[call], gtid[call] & ~0xFFFFFF,
            first_string + len(CUDA_CALLS) + gpu["op_name"]]
    kernel = gpu["op_name"] >= 0
    for rows, insert, width in ((kernel, KERNEL_INSERT, 5), (~kernel, MEMCPY_INSERT, 4)):
        by_time = np.flatnonzero(rows)[np.argsort(gpu["op_start"][rows], kind="stable")]
        con.executemany(insert, zip(*(c[by_time].tolist() for c in cols[:width])))


KERNEL_INSERT = (
    "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, correlationId, globalPid, shortName, "
    "demangledName, deviceId, contextId, streamId, registersPerThread, gridX, gridY, gridZ, "
    "blockX, blockY, blockZ, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, "
    "localMemoryTotal, gridId, tensorSizeMinusOneElements) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?5, 0, 1, 7, 32, 1, 1, 1, 128, 1, 1, 0, 0, 0, 0, 1, '')")
MEMCPY_INSERT = (
    "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, end, correlationId, globalPid, bytes, "
    "copyKind, deviceId, contextId, streamId) VALUES (?, ?, ?, ?, 4096, 1, 0, 1, 14)")


def cached_file(rows: int, gpu: bool = True) -> Path:
    path = Path(f"/tmp/mmscope-analyze-bench-v3-{rows}.sqlite" if gpu else
                f"/tmp/mmscope-analyze-bench-v4-{rows}-nvtx.sqlite")
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        t = time.perf_counter()
        generate(tmp, rows, gpu=gpu)
        os.replace(tmp, path)
        print(f"generated {path} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return path


# --- measurements: each in a fresh process, so peak RSS belongs to that case alone -----------
# Peak RSS is VmHWM: ru_maxrss survives exec, so a child would report its parent's peak.
HWM = ("def hwm():\n"
       "    for line in open('/proc/self/status'):\n"
       "        if line.startswith('VmHWM:'):\n"
       "            return int(line.split()[1])\n")

BARE_SCAN = HWM + f"""
import sqlite3, sys, time
t = time.perf_counter()
n, total = sqlite3.connect(sys.argv[1]).execute({BARE_SQL!r}).fetchone()
print(n, time.perf_counter() - t, hwm(), total)
"""

# DuckDB over its SQLite scanner, as the analyzer connects: count(*), then the analyzer's
# columns aggregated inside DuckDB (every value read, no row handed to Python).
DUCKDB_SCAN = HWM + f"""
import sys, time
from mmscope.analyze.readers import sqlite_source
con = sqlite_source.connect(sys.argv[1], WORKERS)
t = time.perf_counter()
if sys.argv[2] == "count":
    n = con.execute("SELECT count(*) FROM db.NVTX_EVENTS").fetchone()[0]
elif sys.argv[2] == "cupti":  # the analyzer's join of the CUPTI tables, every column counted
    from mmscope.analyze.readers import cupti
    tables = {{r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}}
    ops = " UNION ALL ".join(cupti.OP.format(name=cupti.OPS[t], table=t)
                             for t in cupti.OPS if t in tables)
    join = cupti.JOIN.format(ops=ops, runtime=cupti.RUNTIME, thread_bits=cupti.THREAD_BITS)
    n = con.execute('SELECT count(*), count(thread), count(call_start), count(start), '
                    'count("end"), count(name), count(stream) FROM (' + join
                    + ')').fetchone()[0]
else:
    cols = {SCAN_COLUMNS!r}.split(", ")
    n = con.execute("SELECT count(*), " + ", ".join(f"count({{c}})" for c in cols)
                    + " FROM db.NVTX_EVENTS").fetchone()[0]
print(n, time.perf_counter() - t, hwm(), 0)
"""

# The command as users run it, in-process.
ANALYZE_CLI = HWM + """
import contextlib, io, os, resource, sys, time
t = time.perf_counter()
from mmscope import cli
with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
    rc = cli.main(["analyze", sys.argv[1], "--json"] + sys.argv[2:])
assert rc == 0
print(rc, time.perf_counter() - t, hwm(), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""

# The parts of the analysis, timed one by one, in a process set up as the command sets up its
# own (memory settings, then imports).
PHASES = HWM + """
import json, os, resource, sys, time
from mmscope.analyze.commands import analyze as command
command.prepare_process()
from mmscope.analyze.ranges import benefit, checks, device, frame, per_step, stats, steps, table as tbl
from mmscope.analyze.readers import cupti, nsys
from mmscope.analyze import load
from mmscope.analyze.report.analysis import analysis as report
out, t = {}, [time.perf_counter()]
def lap(name):
    now = time.perf_counter()
    out[name], t[0] = now - t[0], now
def timed(module, attr, label):
    inner = getattr(module, attr)
    def wrapper(*args):
        start = time.perf_counter()
        try:
            return inner(*args)
        finally:
            out[label] = time.perf_counter() - start
    setattr(module, attr, wrapper)
timed(nsys, "_read_events", "  of which DuckDB reads NVTX_EVENTS into numpy")
timed(tbl, "nest_with_crossings", "  of which nesting")
timed(cupti, "read", "  of which DuckDB joins the CUPTI tables into numpy")
timed(device, "per_range", "  of which device time per range")
table = load(sys.argv[1], workers=WORKERS); lap("load (read + table + nesting)")
built = frame.build(table, WORKERS); lap("frame: tree nodes, self time, roles, device")
by_node, by_stage = stats.aggregate(built.sql, table.device is not None)
stats.flat(built, by_node, by_stage); stats.tree(built, by_node); lap("stage tree and table (SQL)")
pairs = steps.step_join(built); step_table = steps.steps_of(built, pairs)
steps.summary(built, pairs); lap("step join")
checks.run_all(built, pairs); lap("checks")
benefit.cache_benefit(built, step_table); per_step.per_step(built, step_table)
report.profile_info(sys.argv[1], built); lap("cache benefit, per-step view, profile")
out["rows"] = len(table)
out["rss"] = hwm()
print(json.dumps(out))
"""


CPU = {}  # the CPU seconds (user + system) of the last child run by _python, all its threads


def _python(code: str, *args: str, exe: str = sys.executable, env=None) -> tuple[float, str]:
    """Wall seconds of a fresh `python -c code args` and its last output line."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run([exe, "-c", code, *args], capture_output=True, text=True, cwd=REPO,
                          env=env)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU["last"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1])
    return wall, (done.stdout.strip().splitlines() or [""])[-1]


def measure(path: Path, workers: int | None) -> dict:
    extra = [] if workers is None else ["--workers", str(workers)]
    wall, line = _python(BARE_SCAN, str(path))
    n, inner, rss, total = line.split()
    bare = {"wall": wall, "cpu": CPU["last"], "inner": float(inner), "rss": int(rss) / 1024,
            "rows": int(n), "sum": int(total)}
    scans = {}
    for key in ("count", "columns", "cupti"):
        wall, line = _python(DUCKDB_SCAN.replace("WORKERS", repr(workers)), str(path), key)
        _, inner, rss, _ = line.split()
        scans[key] = {"wall": wall, "cpu": CPU["last"], "inner": float(inner),
                      "rss": int(rss) / 1024}
    # Three runs against an analysis cache of their own, empty before the first: the first run
    # (computes, stores), the second (answers from the cache), and --no-cache (computes only).
    with tempfile.TemporaryDirectory(prefix="mmscope-bench-cache-") as home:
        env = {**os.environ, "XDG_CACHE_HOME": home}
        runs = {}
        for key, args in (("cli", extra), ("warm", extra), ("nocache", extra + ["--no-cache"])):
            wall, line = _python(ANALYZE_CLI, str(path), *args, env=env)
            _, inner, rss, child = line.split()
            runs[key] = {"wall": wall, "cpu": CPU["last"], "inner": float(inner),
                         "rss": int(rss) / 1024, "child_rss": int(child) / 1024}
    _, line = _python(PHASES.replace("WORKERS", repr(workers)), str(path))
    return {"bare": bare, "duckdb_count": scans["count"], "duckdb_columns": scans["columns"],
            "duckdb_cupti": scans["cupti"], **runs, "phases": json.loads(line)}


# --- the peer: nsys-ai's NVTX summary of the same file --------------------------------------
# nsys-ai queries through DuckDB, whose SQLite reader (the sqlite_scanner extension) it would
# download at run time; PyPI ships that extension as a wheel built for one DuckDB version, so the
# peer environment pins that DuckDB and installs the extension from the wheel (no network needed).
PEER_VENV = Path(os.environ.get("MMSCOPE_PEER_VENV", "/tmp/peer-venv"))
PEER_PACKAGES = ("nsys-ai==0.3.0", "duckdb==1.5.5", "duckdb-extension-sqlite-scanner==1.5.5")

# Profile(...).aggregate_nvtx_ranges() is nsys-ai's NVTX summary (range count and total time per
# name): what its `diff` and profile-health skill report for NVTX. Profile() opens the file the
# way every nsys-ai command does: its Parquet cache (built beside the file on the first run), else
# DuckDB straight over the SQLite file, else plain sqlite3.
PEER = HWM + """
import json, sys, time
from pathlib import Path
t = time.perf_counter()
from nsys_ai.profile import Profile
prof = Profile(sys.argv[1])
rows = prof.aggregate_nvtx_ranges()
wall = time.perf_counter() - t
cache = Path(sys.argv[1]).with_suffix(".nsys-cache")
if prof.db is None:
    engine = f"plain sqlite3 (DuckDB failed: {str(prof.cache_error).splitlines()[0][:80]})"
elif cache.is_dir() and prof.cache_error is None:
    engine = "DuckDB over its Parquet cache"
else:
    engine = "DuckDB over the SQLite file (sqlite_scanner)"
print(json.dumps({"names": len(rows), "count": sum(r["count"] for r in rows), "inner": wall,
                  "rss": hwm(), "engine": engine}))
"""

EXTENSION_SETUP = """
import glob, os, duckdb, duckdb_extension_sqlite_scanner as ext
path = glob.glob(os.path.join(os.path.dirname(ext.__file__), "extensions", "*",
                              "sqlite_scanner.duckdb_extension"))[0]
con = duckdb.connect()
con.execute(f"INSTALL '{path}'")
con.execute("LOAD sqlite_scanner")
print(duckdb.__version__, path)
"""


def _peer_env() -> dict:
    # DuckDB keeps extensions under ~/.duckdb: a HOME inside the peer's venv keeps them there.
    return {**os.environ, "HOME": str(PEER_VENV / "home"), "PYTHONNOUSERSITE": "1"}


def _run_step(cmd: list[str]) -> bool:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        print(f"peer: NOT RUN: `{' '.join(cmd[:5])} ...` failed: {why}")
    return done.returncode == 0


def ensure_peer() -> str | None:
    """The peer's python, creating its venv when missing; None (and a printed reason) on failure."""
    python = PEER_VENV / "bin" / "python"
    if not python.exists():
        print(f"peer: creating {PEER_VENV} (python3 -m venv)", file=sys.stderr)
        if not _run_step(["python3", "-m", "venv", str(PEER_VENV)]):
            return None
    if subprocess.run([str(python), "-c", "import nsys_ai, duckdb_extension_sqlite_scanner"],
                      capture_output=True).returncode != 0:
        print(f"peer: installing {' '.join(PEER_PACKAGES)} into {PEER_VENV} from PyPI",
              file=sys.stderr)
        if not _run_step([str(python), "-m", "pip", "install", "--quiet", *PEER_PACKAGES]):
            return None
    home = PEER_VENV / "home"
    if not any(home.glob(".duckdb/extensions/*/*/sqlite_scanner.duckdb_extension")):
        home.mkdir(exist_ok=True)
        print(f"peer: installing DuckDB's sqlite_scanner extension from its PyPI wheel into "
              f"{home}/.duckdb", file=sys.stderr)
        try:
            _python(EXTENSION_SETUP, exe=str(python), env=_peer_env())
        except RuntimeError as e:
            print(f"peer: sqlite_scanner extension not installed ({e}); nsys-ai will try to "
                  "download it and fall back to sqlite3 where it cannot", file=sys.stderr)
    try:
        _python("import nsys_ai.profile", exe=str(python), env=_peer_env())
    except RuntimeError as e:
        print(f"peer: NOT RUN: nsys-ai does not import in {PEER_VENV}: {e}")
        return None
    return str(python)


def _drop_peer_cache(path: Path) -> None:
    """nsys-ai's Parquet cache sits beside the profile: <name>.nsys-cache (and a build lock)."""
    for p in path.parent.glob(path.stem + ".nsys-cache*"):
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()


def measure_peer(path: Path, python: str) -> list[dict]:
    """Three runs: the first (nsys-ai builds its cache), the second (cache warm), and one with
    NSYS_AI_CACHE_MODE=direct (DuckDB over the SQLite file, no cache), each in a fresh process."""
    version = subprocess.run([python, "-c", "import nsys_ai; print(nsys_ai.__version__)"],
                             capture_output=True, text=True).stdout.strip() or "?"
    runs = [("first run", "builds its Parquet cache", {}, True),
            ("second run", "its cache warm", {}, False),
            ("direct mode", "NSYS_AI_CACHE_MODE=direct", {"NSYS_AI_CACHE_MODE": "direct"}, True)]
    out = []
    for key, note, env, fresh in runs:
        if fresh:
            _drop_peer_cache(path)
        try:
            wall, line = _python(PEER, str(path), exe=python, env={**_peer_env(), **env})
        except RuntimeError as e:
            print(f"peer: nsys-ai {version} FAILED on {path.name} ({key}, {note}): {e}")
            continue
        got = json.loads(line)
        out.append({**got, "key": key, "label": f"nsys-ai {version}, {key} ({note})",
                    "wall": wall, "cpu": CPU["last"], "rss": got["rss"] / 1024})
    _drop_peer_cache(path)
    return out


def report(path: Path, m: dict, workers) -> None:
    bare, cli, ph = m["bare"], m["cli"], m["phases"]
    ratio = cli["wall"] / bare["wall"]
    total_rss = cli["rss"] + cli["child_rss"]
    print(f"file: {path} ({path.stat().st_size / 2**20:.0f} MiB, {bare['rows']:,} NVTX rows, "
          f"{ph['rows']:,} ranges); cores: {len(os.sched_getaffinity(0))}; workers: "
          f"{'default' if workers is None else workers}")
    print(f"load average (1/5/15 min): before {m['load_before']}, after {m['load_after']}")
    if m.get("rounds", 1) > 1:
        print(f"{m['rounds']} rounds, each case once per round: medians (peak RSS: largest)")
    print(f"{'case':<62}{'wall s':>8}{'CPU s':>7}{'peak RSS MiB':>14}{'x bare':>8}")

    def line(label, wall, cpu=None, rss="", ratio_=None):
        cpu = f"{cpu:.2f}" if cpu is not None else ""
        rss = f"{rss:.0f}" if isinstance(rss, float) else rss
        r = f"{ratio_:.2f}" if ratio_ is not None else ""
        print(f"{label:<62}{wall:>8.2f}{cpu:>7}{rss:>14}{r:>8}".rstrip())

    line(f"bare scan, SQLite alone: {BARE_SQL}", bare["wall"], bare["cpu"], bare["rss"], 1.0)
    for key, label in (("duckdb_count", "floor: DuckDB count(*) over its SQLite scanner"),
                       ("duckdb_columns", "floor: DuckDB reads the analyzer's 8 columns, none "
                                          "to Python"),
                       ("duckdb_cupti", "floor: DuckDB joins the CUPTI tables' 6 columns, none "
                                        "to Python")):
        scan = m[key]
        line(label, scan["wall"], scan["cpu"], scan["rss"], scan["wall"] / bare["wall"])
    line("mmscope analyze --json, first run (fills its cache)", cli["wall"], cli["cpu"],
         cli["rss"], ratio)
    warm, nocache = m["warm"], m["nocache"]
    line("mmscope analyze --json, second run (its cache warm)", warm["wall"], warm["cpu"],
         warm["rss"], warm["wall"] / bare["wall"])
    line("mmscope analyze --json --no-cache", nocache["wall"], nocache["cpu"], nocache["rss"],
         nocache["wall"] / bare["wall"])
    for k in ("load (read + table + nesting)", "  of which DuckDB reads NVTX_EVENTS into numpy",
              "  of which DuckDB joins the CUPTI tables into numpy", "  of which nesting",
              "frame: tree nodes, self time, roles, device", "  of which device time per range",
              "stage tree and table (SQL)", "step join", "checks",
              "cache benefit, per-step view, profile"):
        line("  phase: " + k, ph[k])
    print(f"{'  phases, one process (peak RSS)':<62}{'':>15}{ph['rss'] / 1024:>14.0f}")
    for p in m["peer"]:
        line("peer " + p["label"], p["wall"], p["cpu"], p["rss"], p["wall"] / bare["wall"])
    for p in m["peer"]:
        print(f"  peer {p['key']}: {p['engine']}; {p['names']} names, {p['count']:,} ranges "
              "with end > start")
    floor = m["duckdb_columns"]["wall"] + m["duckdb_cupti"]["wall"]
    verdict = [f"first run <= 2x the read floor ({floor:.2f} s): {cli['wall'] / floor:.2f}x "
               f"{'ok' if cli['wall'] <= 2 * floor else 'MISSED'}",
               f"repeated run <= 0.2 s: {warm['wall']:.2f} s "
               f"{'ok' if warm['wall'] <= 0.2 else 'MISSED'}",
               f"<= 1 GiB: {total_rss:.0f} MiB {'ok' if total_rss <= 1024 else 'MISSED'}"]
    # Like for like: first against first, warm against warm, no cache against direct mode.
    ours = {"first run": ("first run", cli), "second run": ("second run", warm),
            "direct mode": ("--no-cache", nocache)}
    for p in m["peer"]:
        label, mine = ours[p["key"]]
        faster = mine["wall"] < p["wall"]
        verdict.append(f"our {label} faster than peer {p['key']}: "
                       f"{p['wall'] / mine['wall']:.2f}x {'ok' if faster else 'MISSED'}")
    if not m["peer"]:
        verdict.append(f"faster than the peer: not measured ({m['peer_note']})")
    print("targets: " + "; ".join(verdict))

def median_of(rounds: list[dict]) -> dict:
    """One round's shape with each number the median of the rounds' (peak RSS: the largest).
    The peer's runs are matched by key; a run that failed in some round counts where it ran."""
    import statistics

    def merge(items: list):
        first = items[0]
        if isinstance(first, dict):
            return {k: merge([it[k] for it in items if k in it]) for k in first}
        if isinstance(first, int) and not isinstance(first, bool):
            return statistics.median_low(items)  # counts: the same every round
        if isinstance(first, float):
            return statistics.median(items)
        return first

    out = merge([{k: v for k, v in r.items() if k != "peer"} for r in rounds])
    for key in ("rss", "child_rss"):
        for case in ("bare", "duckdb_count", "duckdb_columns", "duckdb_cupti", "cli", "warm",
                     "nocache", "phases"):
            values = [r[case][key] for r in rounds if key in r.get(case, {})]
            if values:
                out[case][key] = max(values)
    peers: dict[str, list] = {}
    for r in rounds:
        for p in r["peer"]:
            peers.setdefault(p["key"], []).append(p)
    out["peer"] = []
    for runs in peers.values():
        merged = merge(runs)
        merged["rss"] = max(p["rss"] for p in runs)
        out["peer"].append(merged)
    return out


def _load_average() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--workers", type=int, help="DuckDB threads (default: one per core)")
    ap.add_argument("--no-peer", action="store_true", help="skip the peer tool")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds of every case; the table shows each figure's median over them "
                    "(peak RSS: the largest)")
    args = ap.parse_args()
    path = cached_file(args.rows)
    python = None if args.no_peer else ensure_peer()
    load_before = _load_average()
    rounds = []
    for _ in range(max(args.repeat, 1)):  # every case once per round, rounds one after another
        m = measure(path, args.workers)
        m["peer"] = measure_peer(path, python) if python else []
        rounds.append(m)
    m = median_of(rounds)
    m["rounds"] = len(rounds)
    m["peer_note"] = "--no-peer" if args.no_peer else "the peer did not run, see above"
    m["load_before"], m["load_after"] = load_before, _load_average()
    report(path, m, args.workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
