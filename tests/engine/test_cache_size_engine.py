"""mmscope cache-size against the real engine: record an access log at a large encoder cache,
predict the hit rate at two smaller ones, run the same workload at those, compare.

Three in-process engines, each in its own subprocess (MMSCOPE_ACCESS_LOG is read at engine start),
run side by side; vLLM sizes the encoder cache to max_num_batched_tokens (16-embed images here).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mmscope.cache_size import model, trace

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "tests.kit.cache_size_run"
RECORDED, SMALLER = 256, (64, 32)


def _result(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    c = json.loads(line[len("RESULT "):])
    return {"queries": c["encoder_cache_queries"], "hits": c["encoder_cache_hits"],
            "rate": c["encoder_cache_hits"] / c["encoder_cache_queries"]}


@pytest.fixture(scope="module")
def runs(tiny_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("cache-size") / "recorded.log"
    procs = {}
    for cap in (RECORDED, *SMALLER):
        extra = ["--log", str(log)] if cap == RECORDED else []
        procs[cap] = subprocess.Popen(
            [sys.executable, "-m", SCRIPT, tiny_model, str(cap), *extra], cwd=REPO,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return str(log), {cap: _result(p) for cap, p in procs.items()}


def test_prediction_matches_engine_at_smaller_capacities(runs):
    log, observed = runs
    proc = subprocess.run([sys.executable, "-m", "mmscope.cache_size.command", log, "--json",
                           "--capacities", ",".join(map(str, SMALLER))],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    predicted = {p["capacity_tokens"]: p["hit_rate"] for p in r["curve"]}
    print(f"\nrecorded at {RECORDED}: {observed[RECORDED]['rate']:.3f}; " + "; ".join(
        f"{cap}: predicted {predicted[cap]:.3f} observed {observed[cap]['rate']:.3f}"
        for cap in SMALLER))
    # The workload must really lose hits at the smaller capacities, or the check proves nothing.
    assert observed[32]["rate"] + 0.08 < observed[64]["rate"] < observed[RECORDED]["rate"] - 0.08
    for cap in SMALLER:
        assert observed[cap]["queries"] == r["queries"]
        assert abs(predicted[cap] - observed[cap]["rate"]) <= 0.05, cap


def test_log_agrees_with_engine_counters_at_recorded_capacity(runs):
    log, observed = runs
    t = trace.load(log)
    assert len(t.engines) == 1
    (engine,) = t.engines.values()
    assert engine.capacity == RECORDED
    assert (engine.accesses, engine.hits) == (observed[RECORDED]["queries"],
                                              observed[RECORDED]["hits"])
    c = model.curve(t)
    assert abs(c.hit_rate(RECORDED) - observed[RECORDED]["rate"]) <= 0.05
