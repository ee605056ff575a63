"""Benchmark of `mmscope record` (docs/design.md §8): cost of a recorded NVTX range, and writing speed.

1. ns per push/pop pair through nvtx's lowest-level Python API, in subprocesses with and without
   NVTX_INJECTION64_PATH, interleaved round by round; the target is recorded <= 1.5x bare.
2. The same through the C NVTX headers (nvtxRangePushA, nvtxDomainRangePushEx), recorded.
3. Time to turn a 10-million-range recording into the SQLite export; the target is <= 10 s.
   Wall and CPU time of each step, and beside them SQLite's own cost for rows of that shape
   (one INSERT ... SELECT inside SQLite, no binding), the floor of any road through a SQLite
   library.

usage: python bench/record_overhead.py [--rounds 7] [--pairs 200000] [--ranges 10000000] [--write-only]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADERS = ROOT / "tests" / "kit" / "nvtx_programs"

PY_PAIRS = r"""
import sys, time
from nvtx._lib import lib
dh = lib.DomainHandle("bench")
attrs = lib.EventAttributes(None, lib.RegisteredString(dh, "registered range"), None, None, None)
push, pop = lib.push_range, lib.pop_range
n, best = int(sys.argv[1]), float("inf")
for _ in range(3):
    t = time.perf_counter_ns()
    for _ in range(n):
        push(attrs, dh)
        pop(dh)
    best = min(best, (time.perf_counter_ns() - t) / n)
print(best)
"""

# The writer's process as `mmscope record` prepares it (mmscope/large_arrays.py).
WRITE = r"""
import json, resource, sys, time
from mmscope import large_arrays
large_arrays.plain_pages()
from mmscope.record.writer import write_export
t, c = time.perf_counter(), time.process_time()
s = write_export(sys.argv[1], sys.argv[2])
print(json.dumps({"seconds": time.perf_counter() - t, "cpu_seconds": time.process_time() - c,
                  "events": s.events, "phases": s.phases,
                  "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

# Rows shaped like the recording's: half plain messages in `text`, half registered in `textId`.
SQLITE_FLOOR = r"""
import json, sqlite3, sys, time
from mmscope.record import schema, writer
n, path = int(sys.argv[1]), sys.argv[2]
con = sqlite3.connect(path, isolation_level=None)
for pragma in writer.PRAGMAS:  # the writer's own settings: like for like
    con.execute("PRAGMA " + pragma)
con.execute(schema.NVTX_EVENTS)
t, c = time.perf_counter(), time.process_time()
con.execute("BEGIN")
con.execute("WITH RECURSIVE s(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM s WHERE x < ?) "
            "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId, domainId, eventId) "
            "SELECT x * 100, x * 100 + 50, 59, CASE WHEN x % 2 THEN 'ascii range' END, 281560221750233, "
            "CASE WHEN x % 2 = 0 THEN 3 END, 0, x FROM s", (n,))
con.execute("COMMIT")
print(json.dumps({"seconds": time.perf_counter() - t, "cpu_seconds": time.process_time() - c,
                  "sqlite": sqlite3.sqlite_version}))
"""


def injection_env(spool: str | None) -> dict:
    from mmscope.record import native_library

    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")  # nvtx imports numpy; keep its threads idle
    env.pop("NVTX_INJECTION64_PATH", None)
    env.pop("MMSCOPE_RECORD_DIR", None)
    if spool:
        env.update(NVTX_INJECTION64_PATH=native_library("_nvtx_inject"), MMSCOPE_RECORD_DIR=spool)
    return env


def run_timed(cmd: list[str], recorded: bool) -> str:
    spool = tempfile.mkdtemp(prefix="mmscope-bench-") if recorded else None
    try:
        return subprocess.run(cmd, env=injection_env(spool), check=True, capture_output=True,
                              text=True).stdout
    finally:
        if spool:
            shutil.rmtree(spool, ignore_errors=True)


def python_pairs(rounds: int, pairs: int) -> tuple[list[float], list[float]]:
    bare, rec = [], []
    for _ in range(rounds):
        bare.append(float(run_timed([sys.executable, "-c", PY_PAIRS, str(pairs)], False)))
        rec.append(float(run_timed([sys.executable, "-c", PY_PAIRS, str(pairs)], True)))
    return bare, rec


def compile_c(tmp: str) -> str | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    exe = os.path.join(tmp, "record_nvtx")
    subprocess.run([cc, "-O2", f"-I{HEADERS}", str(ROOT / "bench" / "record_nvtx.c"), "-o", exe, "-ldl"],
                   check=True)
    return exe


def c_pairs(exe: str, rounds: int, pairs: int) -> tuple[list[list[float]], list[list[float]]]:
    bare, rec = [], []
    for _ in range(rounds):
        bare.append([float(x) for x in run_timed([exe, str(pairs), "3"], False).split()])
        rec.append([float(x) for x in run_timed([exe, str(pairs), "3"], True).split()])
    return bare, rec


def write_speed(exe: str, ranges: int, tmp: str) -> dict:
    spool = os.path.join(tmp, "spool")
    os.mkdir(spool)
    t = time.perf_counter()
    subprocess.run([exe, str(ranges // 2), "1"], env=injection_env(spool), check=True, capture_output=True)
    record_s = time.perf_counter() - t
    spool_mib = sum(f.stat().st_size for f in Path(spool).iterdir()) / 2**20
    out = os.path.join(tmp, "big.sqlite")
    res = json.loads(subprocess.run([sys.executable, "-c", WRITE, spool, out], check=True,
                                    capture_output=True, text=True).stdout)
    res.update(record_seconds=record_s, spool_mib=spool_mib, sqlite_mib=os.path.getsize(out) / 2**20)
    shutil.rmtree(spool)
    os.remove(out)
    floor = os.path.join(tmp, "floor.sqlite")
    res["floor"] = json.loads(subprocess.run([sys.executable, "-c", SQLITE_FLOOR, str(res["events"]), floor],
                                             check=True, capture_output=True, text=True).stdout)
    return res


def med(xs):
    return statistics.median(xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--pairs", type=int, default=200_000)
    ap.add_argument("--ranges", type=int, default=10_000_000)
    ap.add_argument("--write-only", action="store_true", help="part 3 alone")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} CPUs, load average {load:.2f} at start\n")

    if not args.write_only:
        bare, rec = python_pairs(args.rounds, args.pairs)
        ratios = [r / b for r, b in zip(rec, bare)]
        print("| NVTX push/pop pair | no tool (ns) | recorded (ns) | ratio | target |")
        print("|---|---|---|---|---|")
        print(f"| Python `nvtx._lib.lib.push_range/pop_range`, median of {args.rounds} interleaved runs "
              f"| {med(bare):.0f} | {med(rec):.0f} | {med(rec) / med(bare):.2f} "
              f"(per-run median {med(ratios):.2f}, best {min(ratios):.2f}) | <= 1.5 |")
    with tempfile.TemporaryDirectory(prefix="mmscope-bench-") as tmp:
        exe = compile_c(tmp)
        if exe is None:
            print("\n(no C compiler: C figures and the write benchmark skipped)")
            return 0
        if not args.write_only:
            cb, cr = c_pairs(exe, args.rounds, args.pairs * 5)
            for i, name in enumerate(["C `nvtxRangePushA/Pop` (message interned per call)",
                                      "C `nvtxDomainRangePushEx/Pop` (registered string)"]):
                print(f"| {name} | {med([b[i] for b in cb]):.1f} | {med([r[i] for r in cr]):.1f} | "
                      f"+{med([r[i] for r in cr]) - med([b[i] for b in cb]):.1f} ns | context |")
        w = write_speed(exe, args.ranges, tmp)
    print("\n| recording -> SQLite | figure | target |\n|---|---|---|")
    print(f"| ranges written | {w['events']:,} | |")
    print(f"| write time (read spool, build rows, write SQLite) | {w['seconds']:.2f} s wall, "
          f"{w['cpu_seconds']:.2f} s CPU | <= 10 s |")
    for name, (wall, cpu) in w["phases"].items():
        print(f"| - {name} | {wall:.2f} s wall, {cpu:.2f} s CPU | |")
    f = w["floor"]
    print(f"| SQLite {f['sqlite']} alone, same number of rows (INSERT ... SELECT, stdlib sqlite3) "
          f"| {f['seconds']:.2f} s wall, {f['cpu_seconds']:.2f} s CPU | floor |")
    print(f"| writer peak memory | {w['max_rss_mib']:.0f} MiB | |")
    print(f"| spool / SQLite size | {w['spool_mib']:.0f} MiB / {w['sqlite_mib']:.0f} MiB | |")
    print(f"| recording them (C, one thread) | {w['record_seconds']:.2f} s | |")
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
