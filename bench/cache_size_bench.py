"""Benchmark of `mmscope cache-size`: a million access-log records, read and turned into
the whole hit-rate curve, against the per-capacity reference simulation of the same log.

Generates a synthetic log (cached in /tmp): two engines, requests of 1-3 images drawn from a
Zipf-like catalogue, 24 requests in flight per engine, one F line per request.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from mmscope.carry import access_log

REPO = Path(__file__).resolve().parent.parent
SIZES = (576, 576, 576, 1024, 256)  # embeddings per image: mostly one size, some others
IN_FLIGHT = 24
RECORDED = 8192  # the capacity the synthetic engines "ran" with


def make_log(path: str, records: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    n_images = records  # more than needed: generation stops at `records` lines
    catalogue = max(1000, records // 4)
    keys = np.minimum(rng.zipf(1.2, n_images), catalogue) - 1
    keys = rng.permutation(catalogue)[keys]  # popular images are not the low ids
    per_req = rng.integers(1, 4, n_images)
    lines, i, req = [access_log.HEADER], 0, 0
    for e in (101, 102):
        lines.append(f"C\t0\t{e}\t{RECORDED}\n")
    in_flight: dict[int, list[str]] = {101: [], 102: []}
    while i < n_images and len(lines) < records:
        engine = 101 + req % 2
        rid = f"req-{req}"
        for item in range(per_req[i]):
            k = int(keys[min(i + item, n_images - 1)])
            lines.append(f"A\t{i}\t{engine}\t{rid}\t{item}\timage\t{k:064x}\t{SIZES[k % 5]}"
                         f"\tMISS\t-\n")
        i += per_req[i]
        in_flight[engine].append(rid)
        if len(in_flight[engine]) > IN_FLIGHT:
            lines.append(f"F\t{i}\t{engine}\t{in_flight[engine].pop(0)}\n")
        req += 1
    Path(path).write_text("".join(_label_outcomes(path, lines)))


def _label_outcomes(path: str, lines: list[str]) -> list[str]:
    """HIT/MISS as an engine at RECORDED would have logged them (the reference simulation)."""
    from mmscope.cache_size import trace
    from mmscope.cache_size.replay import replay

    Path(path).write_text("".join(lines))
    engines = trace.load(path).engines
    outcomes = {name: iter(replay(e.events, RECORDED)) for name, e in engines.items()}
    out = []
    for line in lines:
        p = line.split("\t")
        if p[0] == "A" and next(outcomes[p[2]]):
            p[8], p[9] = "HIT", "local\n"
        out.append("\t".join(p))
    return out


def timed(fn):
    """(result, (wall s, CPU s of this process)): the machine is shared, CPU time is steadier."""
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, (time.perf_counter() - t, time.process_time() - c)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--log", default=None, help="log to use (default: generated in /tmp)")
    args = ap.parse_args()
    from mmscope.cache_size import model, trace

    path = args.log or f"/tmp/mmscope-cache-size-bench-{args.records}.log"
    if not os.path.exists(path):
        _, t = timed(lambda: make_log(path, args.records))
        print(f"generated {path} in {t[0]:.1f} s")
    log, t_load = timed(lambda: trace.load(path))
    rows = [("read the log (trace.load)", t_load)]
    curves = {}
    for release in model.RELEASES:
        curves[release], t = timed(lambda: model.curve(log, release))
        rows.append((f"whole curve, one pass (release={release})", t))
    c = curves["access"]
    grid = c.default_grid()
    _, t = timed(lambda: [c.hit_rate(n) for n in grid] + [c.capacity_for(0.8)])
    rows.append((f"default grid ({len(grid)} capacities) + recommendation", t))
    rss, t_cmd = _run_command(path)
    rows.append(("`mmscope cache-size LOG --json`, whole process", t_cmd))
    rows += _reference_rows(log, curves, grid)
    _report(path, log, c, grid, rows, rss)


def _reference_rows(log, curves, grid) -> list:
    """The per-capacity simulation at one mid-grid capacity (same hits), scaled to the grid."""
    from mmscope.cache_size.replay import replay

    mid, rows = grid[len(grid) // 2], []
    for release, c in curves.items():
        engine_events = [e.events for e in log.engines.values()]
        hits, t = timed(lambda: sum(sum(replay(ev, mid, release)) for ev in engine_events))
        assert hits == c.hits(mid), (hits, c.hits(mid))
        rows.append((f"reference simulation, ONE capacity ({mid}, release={release})", t))
        rows.append((f"  x {len(grid)} grid capacities (estimate)",
                     tuple(x * len(grid) for x in t)))
    return rows


# Run as a script in a fresh interpreter; VmHWM is the new process's own peak (ru_maxrss of a
# child also counts the parent's pages it had right after fork).
_COMMAND = ("import sys; from mmscope.cache_size.command import main; rc = main(sys.argv[1:]); "
            "print([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0], "
            "file=sys.stderr); sys.exit(rc)")


def _run_command(path: str) -> tuple[float, tuple[float, float]]:
    """(peak MiB, (wall s, CPU s)) of the command in its own process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc, (wall, _) = timed(lambda: subprocess.run(
        [sys.executable, "-c", _COMMAND, path, "--json"], check=True, capture_output=True,
        text=True))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return int(proc.stderr.split()[-2]) / 1024, (wall, cpu)


def _report(path, log, c, grid, rows, command_mib) -> None:
    print(f"log: {log.lines:,} lines ({os.path.getsize(path) / 2**20:.0f} MiB), "
          f"{log.accesses:,} accesses, {len(log.engines)} engines, {c.repeats:,} repeats; "
          f"grid {grid[0]}..{grid[-1]} ({len(grid)} capacities); "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"{'':<62} {'wall s':>7} {'CPU s':>7}")
    for name, (wall, cpu) in rows:
        print(f"{name:<62} {wall:7.2f} {cpu:7.2f}")
    print(f"peak RSS of the command {command_mib:.0f} MiB; "
          f"80% hits need {c.capacity_for(0.8)} embeds; every repeat hits from {c.saturation}")


if __name__ == "__main__":
    main()
