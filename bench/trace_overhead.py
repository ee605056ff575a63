"""Cost of one span per backend, side by side with its floor, measured in one run (docs/design.md §8).

Run: .venv/bin/python bench/trace_overhead.py [--n 200000] [--repeat 7]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import textwrap

# Each case runs in its own subprocess so that the backend is chosen before import, as in real use.
CASE = textwrap.dedent("""
    import contextlib, os, sys, time
    case, n, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    import nvtx
    from mmscope.emit import tracing

    def bare_nullcontext():
        nc = contextlib.nullcontext
        for _ in range(n):
            with nc():
                pass

    def raw_nvtx_pair():
        push, pop = nvtx.push_range, nvtx.pop_range
        for _ in range(n):
            push("stage")
            pop()

    def traced_span():
        span = tracing.span
        for _ in range(n):
            with span("stage"):
                pass

    fn = {"nullcontext": bare_nullcontext, "nvtx_raw": raw_nvtx_pair}.get(case, traced_span)
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        # Written out between runs, untimed: no run outgrows chrome.MAX_PENDING and drops events.
        tracing.flush()
        t = time.perf_counter_ns(); fn(); times.append(time.perf_counter_ns() - t)
    print(sorted(times)[len(times) // 2] / n)
""")

# (label, MMSCOPE_TRACE, attach the recorder's NVTX tool?)
CASES = [
    ("bare `with nullcontext()`", "nullcontext", "off", False),
    ("span, tracing off", "span", "off", False),
    ("raw nvtx push/pop, no tool", "nvtx_raw", "off", False),
    ("span, nvtx, no tool", "span", "nvtx", False),
    ("raw nvtx push/pop, tool attached", "nvtx_raw", "off", True),
    ("span, nvtx, tool attached", "span", "nvtx", True),
    ("span, chrome", "span", "chrome", False),
]


def injection_library() -> str | None:
    try:
        from mmscope.record import native_library
        return native_library("_nvtx_inject")
    except ImportError:  # the recorder is optional for this benchmark
        return None


def measure(case: str, trace: str, tool: str | None, n: int, repeat: int, tmp: str) -> float:
    env = dict(os.environ, MMSCOPE_TRACE=trace, MMSCOPE_TRACE_DIR=tmp)
    env.pop("NVTX_INJECTION64_PATH", None)
    if tool:
        env["NVTX_INJECTION64_PATH"] = tool
        env["MMSCOPE_RECORD_DIR"] = tmp
    out = subprocess.run([sys.executable, "-c", CASE, case, str(n), str(repeat)], env=env,
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    tool = injection_library()
    ns = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, case, trace, with_tool in CASES:
            if with_tool and not tool:
                continue
            ns[label] = measure(case, trace, tool if with_tool else None, args.n, args.repeat, tmp)
    floor = {"span, tracing off": "bare `with nullcontext()`",
             "span, nvtx, no tool": "raw nvtx push/pop, no tool",
             "span, nvtx, tool attached": "raw nvtx push/pop, tool attached",
             "span, chrome": "bare `with nullcontext()`",
             "span, chrome (C factory)": "bare `with nullcontext()`"}
    print(f"{'case':36} {'ns/span':>9} {'ratio':>16}")
    for label, v in ns.items():
        ref = floor.get(label)
        ratio = f"{v / ns[ref]:.2f}x {'floor' if ref.startswith('bare') else 'raw'}" if ref in ns else ""
        print(f"{label:36} {v:9.1f} {ratio:>16}")
    print(f"(median of {args.repeat} runs of {args.n} spans each; python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
