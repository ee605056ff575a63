"""Device time beside host time: an nsys export's CUPTI tables projected onto its NVTX ranges
(figures computed by hand), and real torch traces from GPU runs (tests/data/torch), whose every
check passes and whose ranges' device time is what the trace itself says.
"""
from __future__ import annotations

import gzip
import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from mmscope.analyze.ranges import device, stats
from mmscope.analyze import load
from mmscope.analyze.report.analysis import analyze
from tests.kit import nsys as F

TORCH = Path(__file__).parent.parent / "data" / "torch"
TRACES = sorted(TORCH.glob("*.json.gz"))
W, T2, OTHER = 200, 201, 300


def cupti_file(path) -> str:
    """A worker thread's ranges and the GPU work its CUDA calls launched:

    forward      [1000, 5000]   holds every call of thread 200
      encode       [1100, 2000]   c1 -> k1 vit_gemm [3000, 4000]; c2 -> k2 vit_gemm [4100, 4600]
      embed        [2500, 3000]   c3 -> memcpy HtoD [4700, 4800]
      (forward's own)             c4 -> k3 sample [4900, 5600]; c7 -> a graph of two
                                  overlapping kernels [5600, 5700], [5650, 5800]; c6 a sync
    attn [1200, 1900], an NVTX domain's range (another stack), holds c2 only.
    Thread 201 launches c5 outside any range; process 300 reuses correlationId 1 for its own
    kernel [300, 400] inside its range 'other' [50, 200]."""
    with F.NsysFile(path) as f:
        f.domain(1, "attention", pid=W)
        f.range("forward", 1000, 5000, pid=W)
        f.range("encode", 1100, 2000, pid=W)
        f.range("attn", 1200, 1900, pid=W, domain=1)
        f.range("embed", 2500, 3000, pid=W)
        f.range("other", 50, 200, pid=OTHER)
        calls = ((1, 1150, W), (2, 1300, W), (3, 2600, W), (4, 4000, W), (5, 1150, T2),
                 (6, 4500, W), (7, 4200, W))
        for corr, t, tid in calls:
            f.runtime(t, t + 10, corr, pid=W, tid=tid)
        f.runtime(100, 110, 1, pid=OTHER)
        f.kernel(3000, 4000, 1, "vit_gemm", pid=W)
        f.kernel(4100, 4600, 2, "vit_gemm", pid=W)
        f.memcpy(4700, 4800, 3, copy_kind=1, pid=W)
        f.kernel(4900, 5600, 4, "sample", pid=W)
        f.kernel(5000, 5100, 5, "unowned", pid=W, stream=9)
        f.kernel(5600, 5700, 7, "graph_k", pid=W)
        f.kernel(5650, 5800, 7, "graph_k", pid=W)
        f.kernel(300, 400, 1, "other_k", pid=OTHER, device=1)
    return str(path)


@pytest.fixture(scope="module")
def projected(tmp_path_factory):
    path = cupti_file(tmp_path_factory.mktemp("cupti") / "cupti.sqlite")
    table = load(path)
    return table, device.per_range(table), analyze(path, table)


def per_name(table, got) -> dict[str, tuple[int, int, int]]:
    return {table.name_of(i): (int(got.device_ns[i]), int(got.kernel_ns[i]), int(got.ops[i]))
            for i in range(len(table))}


def test_the_projection_by_hand(projected):
    table, got, _ = projected
    assert per_name(table, got) == {
        "forward": (5800 - 3000, 1000 + 500 + 100 + 700 + 100 + 150, 6),
        "encode": (4600 - 3000, 1000 + 500, 2),
        "attn": (4600 - 4100, 500, 1),
        "embed": (100, 100, 1),
        "other": (100, 100, 1)}


def test_stages_carry_device_and_kernel_time_and_their_top_kernels(projected):
    _, _, analysis = projected
    stages = {s["name"]: s for s in analysis.stages}
    assert (stages["forward"]["device_ns"], stages["forward"]["kernel_ns"]) == (2800, 2550)
    assert stages["forward"]["kernels"] == [
        {"name": "vit_gemm", "count": 2, "total_ns": 1500},
        {"name": "sample", "count": 1, "total_ns": 700},
        {"name": "graph_k", "count": 2, "total_ns": 250},
        {"name": "[CUDA memcpy HtoD]", "count": 1, "total_ns": 100}]
    assert stages["embed"]["kernels"] == [
        {"name": "[CUDA memcpy HtoD]", "count": 1, "total_ns": 100}]
    # An NVTX domain's range is a stack of its own: its kernels are counted there too.
    assert stages["attn"]["kernels"] == [{"name": "vit_gemm", "count": 1, "total_ns": 500}]


def test_devices_and_streams_are_named_as_such(projected):
    _, _, analysis = projected
    info = analysis.profile
    assert info["device"]["available"] and info["device"]["source"] == "nsys CUPTI"
    assert {s["stream"]: (s["ops"], s["kernel_ns"]) for s in info["device"]["streams"]} == {
        "GPU 0 stream 7": (5, 1000 + 500 + 700 + 100 + 150),
        "GPU 0 stream 9": (1, 100), "GPU 0 stream 14": (1, 100), "GPU 1 stream 7": (1, 100)}
    assert sorted(p["pid"] for p in info["processes"]) == [W, OTHER]


def test_an_export_without_cupti_tables_says_so_once(tmp_path):
    path = F.pipeline_file(tmp_path / "p.sqlite")
    analysis = analyze(path, load(path))
    assert analysis.profile["device"] == {
        "available": False, "reason": "no CUDA trace in the export (nsys profile -t cuda,nvtx "
        "records the CUPTI runtime, kernel, memcpy and memset tables)"}
    assert all(s["device_ns"] is None and s["kernel_ns"] is None for s in analysis.stages)


def test_the_projection_waits_for_the_host_figures(projected, monkeypatch):
    """The analysis' peak memory: the device projection (on the second core) never runs while
    the host figures are measured, however long they take (their columns are not held at
    once); the figures come out the same."""
    table, _, before = projected
    spans: dict[str, tuple[float, float]] = {}

    def timed(name, fn, delay=0.0):
        def run(*args):
            start = time.perf_counter()
            time.sleep(delay)
            try:
                return fn(*args)
            finally:
                spans[name] = (start, time.perf_counter())
        return run

    monkeypatch.setattr(stats, "measure", timed("measure", stats.measure, delay=0.5))
    monkeypatch.setattr(device, "per_range", timed("per_range", device.per_range))
    again = analyze(before.path, table)
    assert spans["per_range"][0] >= spans["measure"][1]
    assert again.to_json() == before.to_json()


# --- real torch traces from GPU runs ---------------------------------------------------------
def events(path: Path) -> list[dict]:
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def ns(us) -> int:
    return round(float(us) * 1000)


@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_every_check_passes_and_each_annotation_is_one_range(path):
    evs = events(path)
    annotations = [e for e in evs if e.get("cat") == "user_annotation" and e["ph"] == "X"]
    table = load(str(path))
    analysis = analyze(str(path), table, raw_names=True)  # one stage per annotation name
    assert [c for c in analysis.checks if not c["ok"]] == []
    assert len(table) == len(annotations)  # no operator, kernel or device span became a range
    counts = {}
    for e in annotations:
        counts[e["name"]] = counts.get(e["name"], 0) + 1
    assert {s["name"]: s["count"] for s in analysis.stages} == counts
    assert analysis.profile["device"]["available"]
    gpu_pids = {e["pid"] for e in evs if e.get("cat") == "kernel"}
    assert not gpu_pids & {p["pid"] for p in analysis.profile["processes"]}
    assert all(s["stream"].startswith("GPU ") and " stream " in s["stream"]
               for s in analysis.profile["device"]["streams"])


@pytest.mark.parametrize("name", ["hta-ddp-a100-nccl.json.gz", "tracelens-bert-small-h100.json.gz"])
def test_an_annotations_device_time_is_its_gpu_user_annotation(name):
    """The device span Kineto states for an annotation (its gpu_user_annotation, matched by
    External id) is that range's device time, for a range without annotated children."""
    evs = events(TORCH / name)
    spans = {}
    for e in evs:
        if e.get("cat") == "gpu_user_annotation":
            first, last = spans.get(e["args"]["External id"], (math.inf, -math.inf))
            spans[e["args"]["External id"]] = (min(first, ns(e["ts"])),
                                               max(last, ns(e["ts"]) + ns(e["dur"])))
    table = load(str(TORCH / name))
    got = device.per_range(table)
    annotations = [e for e in evs if e.get("cat") == "user_annotation" and e["ph"] == "X"]
    checked = 0
    for e in annotations:
        span = spans.get(e["args"]["External id"])
        (row,) = np.flatnonzero((table.start == ns(e["ts"])) & (table.thread & 0xFFFFFF == e["tid"]))
        if span is None or (table.parent == row).any():
            continue
        assert got.device_ns[row] == span[1] - span[0], e["name"]
        checked += 1
    assert checked >= 1


def test_a_graph_replay_counts_every_op_it_launched():
    """vLLM's decode step replays one GPU graph: hundreds of ops share its launch's correlation;
    the step's range holds them all (no gpu_user_annotation in this trace: their span)."""
    evs = events(TORCH / "tracelens-vllm-decode-graph.json.gz")
    (step,) = [e for e in evs if e.get("cat") == "user_annotation"]
    lo, hi = ns(step["ts"]), ns(step["ts"]) + ns(step["dur"])
    calls = {e["args"]["correlation"] for e in evs if e.get("cat") == "cuda_runtime"
             and e["tid"] == step["tid"] and lo <= ns(e["ts"]) and ns(e["ts"]) + ns(e["dur"]) <= hi}
    ops = [e for e in evs if e.get("cat") in ("kernel", "gpu_memcpy")
           and e["args"]["correlation"] in calls]
    assert len(ops) > 400
    analysis = analyze("vllm", load(str(TORCH / "tracelens-vllm-decode-graph.json.gz")))
    (stage,) = analysis.stages
    assert stage["kernel_ns"] == sum(ns(e["dur"]) for e in ops)
    assert stage["device_ns"] == (max(ns(e["ts"]) + ns(e["dur"]) for e in ops)
                                  - min(ns(e["ts"]) for e in ops))
    assert stage["device_ns"] > 4 * stage["total_ns"]  # the host launched it in a quarter


def kineto(path, spans, ts_float=True) -> str:
    """A Kineto trace of user annotations (name, start µs, duration µs) on one thread."""
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": n, "ts": s if ts_float else int(s),
         "dur": d, "pid": 1, "tid": 1} for n, s, d in spans]}))
    return str(path)


def test_a_torch_traces_rounding_is_tolerated_and_no_more(tmp_path):
    """Epoch times in float µs resolve to 0.25 µs: a child may end up to two resolutions (0.5 µs)
    after its parent and still nest; 3 µs after, it crosses."""
    base = 1_712_195_495_505_583.0
    table = load(kineto(tmp_path / "t.json", [("step", base, 100.0),
                                              ("inner", base + 50, 50.25),
                                              ("late", base + 200, 10.0),
                                              ("crossing", base + 205, 8.0)]))
    assert table.slack_ns == 500
    parent = {table.name_of(i): table.parent[i] for i in range(len(table))}
    assert table.name_of(parent["inner"]) == "step"
    assert parent["crossing"] == -1 and len(table.crossing) == 1


def test_terminal_and_csv_show_device_beside_host_time(projected, tmp_path):
    import csv
    import io

    from rich.console import Console

    from mmscope.analyze.report.terminal import print_terminal, write_csv

    _, _, analysis = projected
    out = io.StringIO()
    print_terminal(analysis, Console(file=out, width=250), flat=True)
    text = out.getvalue()
    assert "device time: 8 GPU ops (nsys CUPTI) on GPU 0 stream 7 5 ops" in text
    header = next(line for line in text.splitlines() if "stage" in line and "total" in line)
    assert header.index("self") < header.index("device") < header.index("kernels") < header.index("mean")
    write_csv(analysis, str(tmp_path / "s.csv"))
    rows = {r["name"]: r for r in csv.DictReader((tmp_path / "s.csv").open())}
    assert (rows["forward"]["device_ns"], rows["forward"]["kernel_ns"]) == ("2800", "2550")

    plain = F.pipeline_file(tmp_path / "p.sqlite")
    analysis = analyze(plain, load(plain))
    out = io.StringIO()
    print_terminal(analysis, Console(file=out, width=250))
    assert out.getvalue().count("device time: none (no CUDA trace in the export") == 1
    assert "kernels" not in out.getvalue()
    write_csv(analysis, str(tmp_path / "p.csv"))
    assert all(r["device_ns"] == "" for r in csv.DictReader((tmp_path / "p.csv").open()))
