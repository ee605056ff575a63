"""What one call of each library mechanism the plugin relies on costs, counted in instructions by
Callgrind: the floor under the plugin's per-request and per-step cost (bench/README).

Each case's statement runs N times in a fresh interpreter under Callgrind, and the same loop again
with `pass` in its place; the difference over N is one call (about a minute for every case).
Run: .venv/bin/python bench/call_costs.py [--n 20000]
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile

# case -> (set-up, the statement timed); the set-up runs in both the N and the 0 run.
CASES = {
    "a plain method call": (
        "class A:\n    def m(self, x): return x\na = A()", "a.m(1)"),
    "a wrapt-wrapped method call (the wrapper only calls through)": (
        "import wrapt\nclass A:\n    def m(self, x): return x\n"
        "wrapt.wrap_function_wrapper(A, 'm', lambda w, i, args, kw: w(*args, **kw))\na = A()",
        "a.m(1)"),
    "prometheus_client Histogram.observe, first bucket": (
        "import prometheus_client as pc\nfrom mmscope.expose.metrics import STAGE_BUCKETS\n"
        "h = pc.Histogram('h', 'h', ['a'], buckets=STAGE_BUCKETS,"
        " registry=pc.CollectorRegistry()).labels('x')", "h.observe(1e-6)"),
    "prometheus_client Histogram.observe, 1.5 ms (eighth bucket)": (
        "import prometheus_client as pc\nfrom mmscope.expose.metrics import STAGE_BUCKETS\n"
        "h = pc.Histogram('h', 'h', ['a'], buckets=STAGE_BUCKETS,"
        " registry=pc.CollectorRegistry()).labels('x')", "h.observe(0.0015)"),
    "prometheus_client Counter.inc": (
        "import prometheus_client as pc\n"
        "c = pc.Counter('c', 'c', ['a'], registry=pc.CollectorRegistry()).labels('x')", "c.inc(1)"),
}


def program(setup: str, statement: str, n: int) -> str:
    return f"{setup}\ndef run():\n    for _ in range({n}):\n        {statement}\nrun()\n"


def count(valgrind: str, source: str, folder: str) -> int:
    out = f"{folder}/cg.out"
    done = subprocess.run([valgrind, "--tool=callgrind", f"--callgrind-out-file={out}",
                           sys.executable, "-c", source], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"call_costs: the case failed: {done.stderr.strip().splitlines()[-1]}")
    totals = re.search(r"^totals: (\d+)", open(out).read(), re.M)
    return int(totals.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000, help="calls per counted run (default 20000)")
    args = ap.parse_args()
    if args.n < 1:
        raise SystemExit("call_costs: --n must be positive")
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("call_costs: valgrind is not installed (Debian: apt-get install valgrind)")
    print(f"instructions per call (Callgrind, {args.n} calls less {args.n} passes)")
    with tempfile.TemporaryDirectory() as folder:
        for name, (setup, statement) in CASES.items():
            empty = count(valgrind, program(setup, "pass", args.n), folder)
            full = count(valgrind, program(setup, statement, args.n), folder)
            print(f"  {(full - empty) / args.n:8,.0f}  {name}", flush=True)


if __name__ == "__main__":
    main()
