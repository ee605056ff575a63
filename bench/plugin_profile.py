"""Where mmscope's cost inside the engine goes, two ways, on the tiny-model workload of
plugin_overhead.py: py-spy samples landing in mmscope's code, and each hook's own time.

The own time of a hook is its wrapper's time minus the wrapped vLLM function's, both clocked
around every call (the clocks' own cost measured and subtracted). Both figures move far less with
the other load on a shared machine than a throughput ratio does (DESIGN §8).

Run: .venv/bin/python bench/plugin_profile.py [--batches 40] [--max-tokens 16] [--rate 1000] [--top 12]
     [--no-spy]
"""
from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYSPY_VENV = Path(os.environ.get("MMSCOPE_PYSPY_VENV", "/tmp/mmscope-pyspy-venv"))
ENGINE_FRAME = "generate (vllm/entrypoints/llm.py"
# Which part of mmscope a sampled frame belongs to, by file.
PARTS = {"patching.py": "hook wrappers (mechanics)", "encoder_cache.py": "accounting",
         "accounting.py": "accounting", "access_log.py": "accounting",
         "stat_loggers.py": "metrics (Prometheus, log line)", "ranges.py": "stage ranges",
         "stage_timing.py": "stage timing", "telemetry.py": "step telemetry",
         "tracing/": "tracing backends"}


def pyspy() -> str:
    """py-spy from PATH, or from its own venv (created and filled from PyPI when missing)."""
    found = shutil.which("py-spy") or (PYSPY_VENV / "bin" / "py-spy")
    if Path(found).exists():
        return str(found)
    print(f"installing py-spy into {PYSPY_VENV}", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(PYSPY_VENV)], check=True)
    subprocess.run([str(PYSPY_VENV / "bin" / "pip"), "install", "--quiet", "py-spy"], check=True)
    return str(PYSPY_VENV / "bin" / "py-spy")


def workload(spec: str, batches: int, max_tokens: int, reset=None) -> None:
    """The child: plugin_overhead.py's batches, all with mmscope on and tracing `spec`;
    `reset` runs after the warm-up."""
    sys.path.insert(0, str(ROOT))
    from vllm import SamplingParams

    from mmscope.demo import tiny_model, tracing
    from mmscope.vllm import ranges
    from tests.kit.engine import image, offline_llm, prompt

    llm = offline_llm(tiny_model.build(tiny_model.default_dir()), max_num_seqs=16)
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    tracing.configure(spec, tempfile.mkdtemp(prefix="mmscope-profile-"))
    ranges.route_vllm_ranges()
    llm.generate([prompt([image(1)], "warm-up")] * 4, sp, use_tqdm=False)
    if reset:
        reset()
    for b in range(batches):
        base = 100_000 * (b + 1)
        llm.generate([prompt([image(base + (i // 2 if i % 2 else i))], f"Question {i}?")
                      for i in range(48)], sp, use_tqdm=False)


def hook_times(spec: str, batches: int, max_tokens: int, out: str) -> None:
    """The child of the own-time figure: every hook's factory wrapped by two clocks; the table
    goes to `out` (vLLM logs to stdout)."""
    import collections as c

    from mmscope.vllm import patching

    clock = time.perf_counter_ns
    outer, inner, calls, keyword_calls = c.Counter(), c.Counter(), c.Counter(), c.Counter()

    def clocked(name, factory):
        def make(original, state):
            def timed_original(*a, **k):
                t = clock()
                try:
                    return original(*a, **k)
                finally:
                    inner[name] += clock() - t
            wrapper = factory(timed_original, state)

            def timed_wrapper(*a, **k):
                t = clock()
                try:
                    return wrapper(*a, **k)
                finally:
                    outer[name] += clock() - t
                    calls[name] += 1
                    keyword_calls[name] += bool(k)
            return timed_wrapper
        return make

    apply = patching.Hook.apply

    def clocked_apply(hook):
        if not getattr(hook, "_clocked", False):
            hook.factory, hook._clocked = clocked(hook.name, hook.factory), True
        return apply(hook)
    patching.Hook.apply = clocked_apply
    start = []
    workload(spec, batches, max_tokens, reset=lambda: (outer.clear(), inner.clear(), calls.clear(),
                                           keyword_calls.clear(),
                                           start.append(time.perf_counter())))
    wall = time.perf_counter() - start[0]
    # The clocks' own cost: an identity wrapper around a function that does nothing, called as
    # vLLM calls the hooked methods: positionally, or (StatLoggerManager.record) with three
    # keyword arguments, which the clocks' *a/**k wrappers pack into a dict twice.
    shims = []
    for call in (lambda f: f(1, 2), lambda f: f(1, scheduler_stats=2, iteration_stats=3,
                                                 mm_cache_stats=4)):
        probe = clocked("identity", lambda original, state: original)(lambda *a, **k: None, None)
        for _ in range(100_000):
            call(probe)
        shims.append((outer.pop("identity") - inner.pop("identity")) / calls.pop("identity"))
        keyword_calls.pop("identity")
    shim, shim_kw = shims
    rows = sorted(((outer[n] - inner[n] - shim * (calls[n] - keyword_calls[n])
                    - shim_kw * keyword_calls[n], n) for n in calls), reverse=True)
    total = sum(own for own, _ in rows)
    lines = [f"tracing={spec}: hooks' own time {total / batches / 1e6:.2f} ms per batch, "
             f"{100 * total / 1e9 / wall:.2f}% of the batches' wall time (clock cost {shim:.0f} ns "
             f"per call subtracted, {shim_kw:.0f} ns for a call with keyword arguments)",
             f"  {'hook':34} {'calls/batch':>11} {'µs/call':>8} {'ms/batch':>9}"]
    lines += [f"  {name:34} {calls[name] / batches:11.1f} {own / calls[name] / 1000:8.2f} "
              f"{own / batches / 1e6:9.3f}" for own, name in rows]
    Path(out).write_text("\n".join(lines) + "\n")


def ours(frame: str) -> bool:
    return "mmscope/" in frame and "bench/" not in frame


def engine_side(frame: str) -> bool:
    return "(vllm/" in frame or "(torch/" in frame


def attribute(raw: Path) -> dict:
    """Engine-thread samples, and those whose innermost frame that is either mmscope's or the
    engine's is mmscope's (so prometheus_client or logging called by mmscope count as mmscope)."""
    engine = 0
    mine: collections.Counter = collections.Counter()
    parts: collections.Counter = collections.Counter()
    other_threads = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n, frames = int(count), stack.split(";")
        if ENGINE_FRAME not in stack:
            if any(ours(f) for f in frames) and "Thread._bootstrap" in frames[0]:
                other_threads += n  # e.g. the chrome flusher: holds the GIL while formatting
            continue
        engine += n
        for f in reversed(frames):
            if ours(f):
                mine[f.split(" (")[0]] += n
                path = f.split("(", 1)[1]
                parts[next((p for k, p in PARTS.items() if k in path), "other")] += n
                break
            if engine_side(f):
                break
    return {"engine": engine, "mine": mine, "parts": parts, "other_threads": other_threads}


def profile(spec: str, batches: int, max_tokens: int, rate: int, spy: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "samples.txt"
        cmd = [spy, "record", "--nonblocking", "-r", str(rate), "-f", "raw", "-o", str(raw),
               "--", sys.executable, __file__, "--workload", spec, "--batches", str(batches),
               "--max-tokens", str(max_tokens)]
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
        t = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0 or not raw.exists():
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise SystemExit(f"profile of tracing={spec} failed: {tail}")
        result = attribute(raw)
        result["wall"] = time.perf_counter() - t
        return result


def report(spec: str, r: dict, top: int) -> None:
    engine, total = r["engine"], sum(r["mine"].values())
    print(f"\ntracing={spec}: {engine} engine-thread samples in {r['wall']:.0f} s; mmscope "
          f"{total} = {100 * total / engine:.2f}% of the engine thread"
          + (f"; other mmscope threads (GIL held) {r['other_threads']} = "
             f"{100 * r['other_threads'] / engine:.2f}%" if r["other_threads"] else ""))
    for part, n in r["parts"].most_common():
        print(f"  {part:34} {100 * n / engine:6.2f}%")
    print(f"  top functions (share of the engine thread):")
    for fn, n in r["mine"].most_common(top):
        print(f"    {100 * n / engine:5.2f}%  {fn}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=16, help="tokens generated per request")
    ap.add_argument("--rate", type=int, default=1000, help="samples per second")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--no-spy", action="store_true", help="only the hooks' own time")
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    ap.add_argument("--hook-times", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.workload:
        return workload(args.workload, args.batches, args.max_tokens)
    if args.hook_times:
        return hook_times(args.hook_times, args.batches, args.max_tokens, args.out)
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    for spec in ("off", "chrome"):
        with tempfile.NamedTemporaryFile("r", suffix=".txt") as out:
            done = subprocess.run([sys.executable, __file__, "--hook-times", spec, "--batches",
                                   str(args.batches), "--max-tokens", str(args.max_tokens),
                                   "--out", out.name],
                                  env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"hook times, tracing={spec}: failed: "
                                 f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")
            print(out.read())
    if args.no_spy:
        return
    spy = pyspy()
    print(f"py-spy {subprocess.run([spy, '--version'], capture_output=True, text=True).stdout.split()[-1]}"
          f", {args.rate} samples/s, {args.batches} batches of 48 image requests ({args.max_tokens} "
          f"tokens each), "
          f"one in-process engine, mmscope on")
    for spec in ("off", "chrome"):
        report(spec, profile(spec, args.batches, args.max_tokens, args.rate, spy), args.top)


if __name__ == "__main__":
    main()
