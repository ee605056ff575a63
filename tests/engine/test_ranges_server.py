"""Stage ranges across the OpenAI server's processes (API server, EngineCore, worker), and the
per-stage duration histograms on /metrics, under both model runners."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mmscope import stages
from mmscope.vllm.runners import LABEL
from tests.kit import runners, traces as tk
from tests.kit.server import chat

pytestmark = [pytest.mark.vllm, pytest.mark.runners]

# Images sent as data URLs reach the hasher with their original bytes (MediaWithBytes).
HASHED = stages.hash_range("image_bytes")


def stage_counts(url) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    out = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == "vllm:mm_stage_duration_seconds":
            for s in fam.samples:
                if s.name.endswith("_count"):
                    out[s.labels["stage"]] = s.value
    return out


def wait_for(pred, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.5)
    return pred()


def test_ranges_land_in_their_processes_and_threads(traced_server):
    srv = traced_server
    # The API server's start-up processes dummy images (multimodal warm-up); one request first
    # so that those durations are already exported before the baseline is read.
    chat(srv.url, srv.model, [800], "Warm?")
    hist0 = stage_counts(srv.url)
    t0 = time.time()
    t0_us = time.perf_counter_ns() / 1000  # CLOCK_MONOTONIC: the clock of every process's trace
    chat(srv.url, srv.model, [801, 802], "Two?")
    chat(srv.url, srv.model, [801], "Again?")
    chat(srv.url, srv.model, [], "Text")

    def loaded():  # the chrome files are appended to every half second
        ranges, threads = tk.load(srv.trace_dir)
        ranges = [r for r in ranges if r.start >= t0_us]  # not the start-up's dummy inputs
        return (ranges, threads) if tk.named(ranges, stages.VIT_FORWARD) and len(
            tk.named(ranges, HASHED)) >= 3 else None

    ranges, threads = wait_for(loaded)
    api_pid = srv.proc.pid
    hashes = tk.named(ranges, HASHED)
    assert {r.pid for r in hashes} == {api_pid}
    assert {r.pid for r in ranges if r.name.startswith(stages.PROCESSOR_PREFIX)} == {api_pid}
    worker = {r.pid for r in ranges if r.name in (stages.VIT_FORWARD, stages.FORWARD)}
    assert len(worker) == 1 and api_pid not in worker
    # step_meta is on the forward's thread, and joins each forward.
    forwards = tk.named(ranges, stages.FORWARD)
    metas = [r for r in ranges if r.name.startswith(stages.STEP_META_PREFIX)]
    assert {(m.pid, m.tid) for m in metas} == {(f.pid, f.tid) for f in forwards}
    assert len(metas) >= len(forwards) > 0
    # The renderer hashes on its own thread, not on the event loop.
    assert {threads.get((r.pid, r.tid)) for r in hashes} != {"MainThread"}
    # The worker names its runner once, at start.
    assert srv.log_text().count(f"mmscope: this worker runs {LABEL[runners.current()]} ") == 1

    # The same boundaries feed /metrics: 3 items hashed, the encoder ran in one step.
    hist = wait_for(lambda: (h := stage_counts(srv.url)).get(stages.VIT_FORWARD, 0)
                    > hist0.get(stages.VIT_FORWARD, 0) and h)
    d = {k: hist.get(k, 0) - hist0.get(k, 0) for k in hist}
    assert d[HASHED] == 3
    assert d[stages.VIT_FORWARD] == 1
    assert d[stages.processor_range("apply_hf_processor")] == 2
    # a gather sample in each step with multimodal embeddings: the two image requests' prefills
    assert d[stages.GATHER_MM_EMBEDDINGS] == 2
    assert time.time() - t0 < 120


def test_probe_lines_in_the_engine_log_agree_with_the_counters(traced_server):
    srv = traced_server
    chat(srv.url, srv.model, [850, 850, 851], "Probe?")
    text = httpx.get(srv.url + "/metrics").text
    counts = {f.name: sum(s.value for s in f.samples if s.name.endswith("_total"))
              for f in text_string_to_metric_families(text)}
    log = srv.log_text()
    assert log.count("mm_cache_probe HIT") == counts["vllm:encoder_cache_hits"]
    assert log.count("mm_cache_probe MISS") == counts["vllm:encoder_cache_misses"]
    assert "Unknown vLLM environment variable detected: VLLM_MM_CACHE_PROBE" not in log


def test_the_servers_trace_passes_every_check_of_the_analyzer(traced_server):
    """What the server's processes wrote while serving, read by `mmscope analyze`: every check
    ok, every step's step_meta joined with its forward, on either runner."""
    chat(traced_server.url, traced_server.model, [870], "Analyzed?")
    time.sleep(1.5)  # the chrome files are appended to every half second
    done = subprocess.run([sys.executable, "-m", "mmscope.cli", "analyze", "--json", "--no-cache",
                           str(traced_server.trace_dir)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert all(c["ok"] for c in doc["checks"]), doc["checks"]
    assert doc["steps"]["pairs"] == doc["steps"]["forwards"] > 0
