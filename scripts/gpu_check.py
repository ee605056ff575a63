"""One prepared check of mmscope's device side on a CUDA GPU: the worker's device clock (against
CUDA events and the profiler), under CUDA-graph capture, without synchronising; its ranges in the
torch profiler; `mmscope record` around a program that opens NVTX ranges; the clock's host cost.

On the GPU machine (PyTorch and a C compiler; no vLLM, no analyzer libraries):
    PYTHONPATH=src python3 scripts/gpu_check.py --out DIR
prints one line per check, writes DIR/gpu_check.json, the torch trace and the NVTX spool; exits 0
when every check passed, 1 otherwise, 2 without a CUDA device. Afterwards, where mmscope's
analyzer is installed:
    PYTHONPATH=src python3 scripts/gpu_check.py --analyze DIR
checks with `mmscope analyze` that each range reports its gpu_user_annotation's device time, and
that the NVTX spool becomes an export holding every range (docs/gpu-runners.md).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

import torch
from torch.profiler import ProfilerActivity, profile

from mmscope import stages
from mmscope.emit import device_events, tracing
from mmscope.emit.stage_timer import StageCollector, timed_stage
from mmscope.record import native_library

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGE = stages.VIT_FORWARD
PROFILED = (stages.VIT_FORWARD, stages.GATHER_MM_EMBEDDINGS, stages.EMBED_INPUT_IDS)
SIZE, CHAIN, GRAPH_CHAIN, REPS = 4096, 50, 20, 5
WITHIN = 0.02  # the largest gap allowed between mmscope's device time and a reference
HOST_COST_BOUND_US = 20.0  # a sanity bound on one stage's host cost on the device clock
WAIT_S = 30.0
TRACE, SPOOL, RESULTS, ANALYZED = "torch-trace.json", "nvtx-spool", "gpu_check.json", "analyze.json"

# The program `mmscope record` wraps: NVTX ranges through torch's own NVTX, around CUDA work.
NVTX_RANGES = {"gpu_check: nvtx push": 3, "gpu_check: nvtx start/end": 1}
NVTX_MARK = "gpu_check: nvtx mark"
NVTX_PROGRAM = f"""
import torch
x = torch.randn(1024, 1024, device="cuda")
for _ in range(3):
    torch.cuda.nvtx.range_push("gpu_check: nvtx push")
    y = x @ x
    torch.cuda.nvtx.range_pop()
r = torch.cuda.nvtx.range_start("gpu_check: nvtx start/end")
y = x @ x
torch.cuda.nvtx.range_end(r)
torch.cuda.nvtx.mark({NVTX_MARK!r})
torch.cuda.synchronize()
"""

# The control of the capture check: an event query from another thread, made the way a plain
# torch program makes it, during a capture in the default (global) mode.
RAW_QUERY_PROGRAM = """
import threading, torch
a = torch.randn(512, 512, device="cuda")
event = torch.cuda.Event(); (a @ a); event.record(); torch.cuda.synchronize()
inside, queried = threading.Event(), threading.Event()
def query():
    inside.wait(30)
    try:
        event.query()
    except Exception:
        pass
    queried.set()
threading.Thread(target=query).start()
s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    a @ a
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(g):
        b = a @ a
        inside.set()
        queried.wait(30)
        b = b @ a
    print("SURVIVED")
except Exception as e:
    print("BROKEN", str(e).splitlines()[0])
"""


def chain(a, b, length: int):
    """`length` matrix products, one kernel each (b is scaled so that the values stay near 1)."""
    x = a
    for _ in range(length):
        x = x @ b
    return x


def gap(value: float, reference: float) -> float:
    return abs(value / reference - 1)


class Device:
    """The check's device, its operands, and collectors timed by mmscope's own device clock."""

    def __init__(self):
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.a = torch.randn(SIZE, SIZE, device=self.device, dtype=torch.bfloat16)
        self.b = torch.randn(SIZE, SIZE, device=self.device, dtype=torch.bfloat16) * SIZE**-0.5
        chain(self.a, self.b, 3)
        torch.cuda.synchronize()
        self.graph = None

    def collector(self) -> StageCollector:
        collector = StageCollector()
        collector.use_device_events(device_events.clock(self.device))
        return collector

    def events(self):
        return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def warm_graph_inputs(self, length: int) -> None:
        """What torch asks before a capture: the work run once on a side stream."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            chain(self.a, self.b, length)
        torch.cuda.current_stream().wait_stream(side)


# --- the checks on the GPU: each returns (passed, figures, one line) -----------------------------
def device_time(d: Device):
    """A stage's device time from mmscope's clock against the script's CUDA events around it and
    the profiler's kernel time; the host time of the same call is what a host clock would say."""
    collector, rows = d.collector(), []
    for _ in range(REPS):
        start, end = d.events()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            start.record()
            t0 = time.perf_counter_ns()
            with timed_stage(STAGE, collector):
                chain(d.a, d.b, CHAIN)
            host_us = (time.perf_counter_ns() - t0) / 1e3
            end.record()
            early = len(collector.drain().get(STAGE, []))  # its kernels still run: nothing yet
            torch.cuda.synchronize()
        (sample_ns,) = collector.drain()[STAGE]
        kernels_us = sum(e.self_device_time_total for e in prof.key_averages())
        rows.append({"host_us": host_us, "read_early": early, "mmscope_us": sample_ns / 1e3,
                     "events_us": start.elapsed_time(end) * 1e3, "kernels_us": kernels_us})
    worst_events = max(gap(r["mmscope_us"], r["events_us"]) for r in rows)
    worst_kernels = max(gap(r["mmscope_us"], r["kernels_us"]) for r in rows)
    passed = worst_events <= WITHIN and worst_kernels <= WITHIN
    last = rows[-1]
    return passed, {"reps": rows, "worst_gap_events": worst_events,
                    "worst_gap_kernels": worst_kernels}, (
        f"{CHAIN} bf16 products of {SIZE}x{SIZE}: mmscope {last['mmscope_us']:.1f} µs, events "
        f"{last['events_us']:.1f} µs, kernels {last['kernels_us']:.1f} µs, host "
        f"{last['host_us']:.1f} µs; largest gap {worst_events:.2%} to events, "
        f"{worst_kernels:.2%} to kernels (≤ {WITHIN:.0%})")


def graph_capture(d: Device):
    """A stage inside torch.cuda.graph's capture: the capture succeeds and the stage records
    nothing there; a stage around each replay is the replay's device time."""
    collector = d.collector()
    d.warm_graph_inputs(GRAPH_CHAIN)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        with timed_stage(STAGE, collector):
            out = chain(d.a, d.b, GRAPH_CHAIN)
        recorded_in_capture = collector.clock.pending
    torch.cuda.synchronize()
    sampled_in_capture = collector.drain()
    rows = []
    for _ in range(REPS):
        start, end = d.events()
        start.record()
        with timed_stage(STAGE, collector):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        (sample_ns,) = collector.drain()[STAGE]
        rows.append({"mmscope_us": sample_ns / 1e3, "events_us": start.elapsed_time(end) * 1e3})
    eager = chain(d.a, d.b, GRAPH_CHAIN).float()
    same = bool((out.float() - eager).norm() <= 0.05 * eager.norm())  # bf16: within rounding
    d.graph = graph
    worst = max(gap(r["mmscope_us"], r["events_us"]) for r in rows)
    passed = not recorded_in_capture and not sampled_in_capture and same and worst <= WITHIN
    return passed, {"recorded_in_capture": recorded_in_capture,
                    "sampled_in_capture": sampled_in_capture, "replay_output_as_eager": same,
                    "replays": rows, "worst_gap_events": worst}, (
        f"capture done, {'an event' if recorded_in_capture else 'no event'} recorded in it; "
        f"replay {rows[-1]['mmscope_us']:.1f} µs by mmscope, {rows[-1]['events_us']:.1f} µs by "
        f"events, largest gap {worst:.2%}; replay output {'=' if same else '!='} eager")


def drain_during_capture(d: Device):
    """The collector drained from another thread (as vLLM's output thread drains the worker's)
    while this thread captures in the default, global mode: the capture survives, the stage
    timed before it is read. The control runs a plain torch event query the same way."""
    collector = d.collector()
    with timed_stage(STAGE, collector):
        chain(d.a, d.b, CHAIN)
    inside, drained, seen = threading.Event(), threading.Event(), {}

    def drain():
        inside.wait(WAIT_S)
        seen["pending"] = collector.clock.pending
        try:
            seen["durations"] = collector.drain()
        except Exception as e:  # noqa: BLE001 - reported as the check's figure
            seen["error"] = repr(e)
        drained.set()

    reader = threading.Thread(target=drain)
    reader.start()
    d.warm_graph_inputs(4)
    graph, error = torch.cuda.CUDAGraph(), None
    try:
        with torch.cuda.graph(graph):  # capture_error_mode="global", torch's default
            out = chain(d.a, d.b, 2)
            inside.set()
            drained_in_capture = drained.wait(WAIT_S)  # a host wait, no CUDA call
            out = chain(out, d.b, 2)
    except RuntimeError as e:
        error, drained_in_capture = str(e).splitlines()[0], drained.is_set()
    reader.join(WAIT_S)
    torch.cuda.synchronize()
    if error is None:
        graph.replay()
        torch.cuda.synchronize()
    # torch.cuda.graph synchronises before it captures: the earlier stage's events had
    # completed, so the drain in the capture read them (a query and an elapsed time).
    read_in_capture = len(seen.get("durations", {}).get(STAGE, []))
    read_after = len(collector.drain().get(STAGE, []))
    control = subprocess.run([sys.executable, "-c", RAW_QUERY_PROGRAM], capture_output=True,
                             text=True, timeout=120).stdout.strip()
    passed = (error is None and drained_in_capture and seen.get("pending")
              and read_in_capture == 1 and read_after == 0)
    return bool(passed), {"capture_error": error, "drain_error": seen.get("error"),
                          "drained_in_capture": drained_in_capture,
                          "pending_when_drained": seen.get("pending"),
                          "read_in_capture": read_in_capture, "read_after": read_after,
                          "control": control}, (
        f"capture {'survived' if error is None else 'broke: ' + error}; drained in it: "
        f"{drained_in_capture}, the earlier stage read there: {read_in_capture == 1}; control, "
        f"a plain query from another thread: {control.split(' ')[0] if control else 'no answer'}")


def no_synchronisation(d: Device):
    """torch.cuda.set_sync_debug_mode("error") around stages, a graph replay and drains: any
    synchronising call raises. The control shows the mode is on: .item() raises in it."""
    collector = d.collector()
    error, control = None, False
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(10):
            with timed_stage(STAGE, collector):
                chain(d.a, d.b, 4)
            collector.drain()
        if d.graph is not None:
            with timed_stage(STAGE, collector):
                d.graph.replay()
        collector.drain()
        try:
            d.a.sum().item()
        except RuntimeError:
            control = True
    except RuntimeError as e:
        error = str(e).splitlines()[0]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    collector.drain()
    passed = error is None and control and not collector.clock.pending
    return passed, {"error": error, "control_item_raised": control}, (
        f"stages, replay and drains in sync-debug 'error' mode: "
        f"{'nothing synchronised' if error is None else error}; control .item() raised: {control}")


def profiler_ranges(d: Device, out: str):
    """mmscope's ranges through the torch backend in a profile of GPU work: each has its
    gpu_user_annotation (the analyzer's reading of it is checked with --analyze)."""
    collector = d.collector()
    tracing.configure("torch")
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for name in PROFILED:
                with timed_stage(name, collector):
                    chain(d.a, d.b, 10)
            torch.cuda.synchronize()
    finally:
        tracing.configure("off")
    samples = {k: v[0] for k, v in collector.drain().items()}
    path = os.path.join(out, TRACE)
    prof.export_chrome_trace(path)
    spans = annotation_device_ns(load_events(path))
    found = {name: spans.get(name) for name in PROFILED}
    gaps = [gap(samples[n], found[n]) for n in PROFILED if found[n]]
    passed = len(gaps) == len(PROFILED) and max(gaps) <= WITHIN
    return passed, {"trace": TRACE, "stages": list(PROFILED), "gpu_user_annotation_ns": found,
                    "mmscope_ns": samples}, (
        f"{len(gaps)} of {len(PROFILED)} ranges have their gpu_user_annotation in {TRACE}; "
        f"largest gap to mmscope's samples {max(gaps, default=float('nan')):.2%}")


def record_nvtx(d: Device, out: str):
    """`mmscope record`'s capture on this machine: its injection library built here with the C
    compiler, attached to a CUDA program that opens ranges through torch.cuda.nvtx, the way
    `mmscope record` attaches it; the spool it writes becomes the SQLite export with --analyze
    (the writer's libraries are not on the GPU machine)."""
    build = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    library = native_library("_nvtx_inject")
    if build.returncode != 0 or library is None:
        tail = (build.stderr or build.stdout).strip().splitlines()[-1:]
        return False, {"build": tail}, f"the injection library did not build: {tail}"
    spool = os.path.join(out, SPOOL)
    os.makedirs(spool, exist_ok=True)
    env = dict(os.environ, NVTX_INJECTION64_PATH=library, MMSCOPE_RECORD_DIR=spool)
    run = subprocess.run([sys.executable, "-c", NVTX_PROGRAM], env=env, capture_output=True,
                         text=True, timeout=300)
    files = [os.path.join(spool, f) for f in os.listdir(spool)]
    data = b"".join(read_bytes(f) for f in files)
    names = [*NVTX_RANGES, NVTX_MARK]
    present = {n: n.encode() in data for n in names}
    passed = run.returncode == 0 and all(present.values())
    return passed, {"spool": SPOOL, "ranges": NVTX_RANGES, "mark": NVTX_MARK,
                    "library": os.path.basename(library), "spool_files": len(files),
                    "spool_bytes": len(data), "names_in_spool": present,
                    "program": run.returncode}, (
        f"library built ({os.path.basename(library)}); program exit {run.returncode}; "
        f"{len(files)} spool file(s), {sum(present.values())} of {len(names)} names in them")


def host_cost(d: Device):
    """What a stage costs the host on the device clock (two events recorded, the capture asked
    twice) and its read at a drain, beside the host clock's, in µs; a tracing-off stage."""
    rounds, per_round = 10, 2000
    host = StageCollector()
    device = d.collector()

    def stages_us(collector) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(per_round):
            with timed_stage(STAGE, collector):
                pass
        return (time.perf_counter_ns() - t0) / 1e3 / per_round

    host_us = min(stages_us(host) for _ in range(rounds))
    host.drain()
    device_us, drain_us = [], []
    for _ in range(rounds):
        device_us.append(stages_us(device))
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        device.drain()
        drain_us.append((time.perf_counter_ns() - t0) / 1e3 / per_round)
    capturing = device.clock.capturing
    t0 = time.perf_counter_ns()
    for _ in range(per_round):
        capturing()
    capture_us = (time.perf_counter_ns() - t0) / 1e3 / per_round
    total = min(device_us) + min(drain_us)
    passed = total <= HOST_COST_BOUND_US
    return passed, {"host_clock_stage_us": host_us, "device_clock_stage_us": min(device_us),
                    "device_clock_drain_per_stage_us": min(drain_us),
                    "capture_query_us": capture_us, "bound_us": HOST_COST_BOUND_US}, (
        f"a stage {min(device_us):.2f} µs + its read {min(drain_us):.2f} µs on the device clock "
        f"(host clock {host_us:.2f} µs; the capture query {capture_us:.2f} µs) ≤ "
        f"{HOST_COST_BOUND_US:g} µs")


# --- the torch trace, read as mmscope's analyzer is checked against it ---------------------------
def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def load_events(path: str) -> list[dict]:
    import gzip

    raw = read_bytes(path)
    return json.loads(gzip.decompress(raw) if path.endswith(".gz") else raw)["traceEvents"]


def annotation_device_ns(events: list[dict]) -> dict[str, int]:
    """Per annotation name, the device time Kineto states for its ranges: each range's
    gpu_user_annotation events (matched by External id), first start to last end, summed."""
    spans: dict = {}
    for e in events:
        if e.get("cat") == "gpu_user_annotation":
            start = round(float(e["ts"]) * 1000)
            end = start + round(float(e["dur"]) * 1000)
            first, last = spans.get(e["args"]["External id"], (start, end))
            spans[e["args"]["External id"]] = (min(first, start), max(last, end))
    totals: dict[str, int] = {}
    for e in events:
        span = spans.get(e.get("args", {}).get("External id"))
        if e.get("cat") == "user_annotation" and e.get("ph") == "X" and span is not None:
            totals[e["name"]] = totals.get(e["name"], 0) + span[1] - span[0]
    return totals


# --- afterwards, where the analyzer runs ---------------------------------------------------------
def mmscope_analyze(path: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "mmscope.cli", "analyze", "--json", "--no-cache",
                           "--raw-names", path], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"mmscope analyze {os.path.basename(path)}: {done.stderr.strip()}")
    return json.loads(done.stdout)


def analyzed_profile(out: str, facts: dict):
    """Each range's device time as `mmscope analyze` reports it: its gpu_user_annotation's."""
    path = os.path.join(out, facts["trace"])
    expected = annotation_device_ns(load_events(path))
    reported = {s["name"]: s for s in mmscope_analyze(path)["stages"]}
    rows = {}
    for name in facts["stages"]:
        stage = reported.get(name, {})
        rows[name] = {"trace_ns": expected.get(name), "analyze_ns": stage.get("device_ns"),
                      "count": stage.get("count")}
    passed = all(r["trace_ns"] and r["analyze_ns"] is not None
                 and abs(r["analyze_ns"] - r["trace_ns"]) <= 1000 * r["count"]
                 for r in rows.values())
    return passed, rows, (
        f"{sum(1 for r in rows.values() if r['trace_ns'] and r['analyze_ns'] == r['trace_ns'])} "
        f"of {len(rows)} ranges report exactly their gpu_user_annotation's device time "
        f"(within 1 µs a range: {passed})")


def analyzed_record(out: str, facts: dict):
    """The spool made into the SQLite export, as `mmscope record` makes it: every range and the
    mark there, as many times as the program opened them; `mmscope analyze` reads it."""
    import sqlite3

    from mmscope.record.writer import write_export

    spool, path = os.path.join(out, facts["spool"]), os.path.join(out, "nvtx.sqlite")
    if not os.path.isdir(spool):
        return False, {}, f"no spool in {out}: the GPU run's record check did not write one"
    write_export(spool, path)
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT COALESCE(e.text, s.value), COUNT(*) FROM NVTX_EVENTS e "
                          "LEFT JOIN StringIds s ON s.id = e.textId GROUP BY 1").fetchall()
    found = dict(rows)
    stages_seen = {s["name"]: s["count"] for s in mmscope_analyze(path)["stages"]}
    expected = {**facts["ranges"], facts["mark"]: 1}
    passed = all(found.get(n) == c for n, c in expected.items()) and all(
        stages_seen.get(n) == c for n, c in facts["ranges"].items())
    return passed, {"events": found, "stages": stages_seen}, (
        f"{sum(found.get(n) == c for n, c in expected.items())} of {len(expected)} names in "
        f"nvtx.sqlite as often as opened; mmscope analyze: "
        f"{', '.join(f'{n} x{c}' for n, c in stages_seen.items())}")


# --- running them --------------------------------------------------------------------------------
def run_checks(checks) -> tuple[bool, list[dict]]:
    results, every = [], True
    for name, check in checks:
        t0 = time.perf_counter()
        try:
            passed, figures, line = check()
        except Exception as e:  # noqa: BLE001 - a check that raises failed; the rest still run
            passed, figures, line = False, {"error": repr(e)}, f"raised {e!r}"
        every &= bool(passed)
        print(f"{'PASS' if passed else 'FAIL'} {name}: {line}", flush=True)
        results.append({"name": name, "passed": bool(passed), "seconds": time.perf_counter() - t0,
                        "figures": figures})
    return every, results


def on_gpu(out: str) -> int:
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a machine with one", file=sys.stderr)
        return 2
    os.makedirs(out, exist_ok=True)
    d = Device()
    print(f"{torch.cuda.get_device_name(d.device)}, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}", flush=True)
    every, results = run_checks([
        ("device_time", lambda: device_time(d)),
        ("graph_capture", lambda: graph_capture(d)),
        ("drain_during_capture", lambda: drain_during_capture(d)),
        ("no_synchronisation", lambda: no_synchronisation(d)),
        ("profiler_ranges", lambda: profiler_ranges(d, out)),
        ("record_nvtx", lambda: record_nvtx(d, out)),
        ("host_cost", lambda: host_cost(d))])
    facts = {r["name"]: r["figures"] for r in results}
    with open(os.path.join(out, RESULTS), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(d.device), "torch": torch.__version__,
                   "cuda": torch.version.cuda, "passed": every, "checks": results,
                   "profiler": facts["profiler_ranges"], "record": facts["record_nvtx"]},
                  f, indent=1, default=str)
    return 0 if every else 1


def analyze(out: str) -> int:
    try:
        with open(os.path.join(out, RESULTS)) as f:
            facts = json.load(f)
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) else e
        print(f"gpu_check: {os.path.join(out, RESULTS)}: {why} (write it with --out on the GPU "
              "machine)", file=sys.stderr)
        return 2
    every, results = run_checks([
        ("analyze_profiler_ranges", lambda: analyzed_profile(out, facts["profiler"])),
        ("analyze_record_nvtx", lambda: analyzed_record(out, facts["record"]))])
    with open(os.path.join(out, ANALYZED), "w") as f:
        json.dump({"passed": every, "checks": results}, f, indent=1, default=str)
    return 0 if every else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", metavar="DIR", help="run the checks on this GPU, results into DIR")
    mode.add_argument("--analyze", metavar="DIR", help="check a GPU run's DIR with the analyzer")
    args = p.parse_args()
    return on_gpu(args.out) if args.out else analyze(args.analyze)


if __name__ == "__main__":
    sys.exit(main())
