"""docs/design.md §9: the plugin never changes vLLM's results, and a failing hook never takes vLLM down."""
from __future__ import annotations

import os

import pytest

from tests.kit.engine import results_run as run

pytestmark = pytest.mark.vllm


def test_same_tokens_and_vllm_timing_without_plugin_with_every_range_and_a_hook_failing(
        tiny_model, tmp_path):
    # With vLLM's own processor timing on, mmscope's stage timer nests it; with it off (the
    # broken run), mmscope's timer stands in for vLLM's no-op one: either way, the same tokens.
    bare = run(tiny_model, "vllm-stats", env={"MMSCOPE_DISABLE": "1"})
    traced = run(tiny_model, "vllm-stats",
                 env={"MMSCOPE_TRACE": "chrome", "MMSCOPE_TRACE_DIR": str(tmp_path)})
    broken = run(tiny_model, "break")
    assert bare["hooks"] == {h: "not applied" for h in bare["hooks"]}
    # The worker's stage hooks retire: the scheduler shares the process and takes the durations.
    retired = {h for h, s in traced["hooks"].items() if s.startswith("retired:")}
    assert retired == {"stage_metrics.execute_model", "stage_metrics.sample_tokens"}
    per_request_span = {"otlp.request_added", "otlp.request_span"}  # once vLLM traces requests
    other_release = {h for h, s in traced["hooks"].items() if s.startswith("not in this release")}
    assert other_release and all(".standalone" in h for h in other_release)  # vLLM 0.34's runner
    assert {s for h, s in traced["hooks"].items()
            if h not in retired | per_request_span | other_release} == {"applied"}
    assert os.listdir(tmp_path)
    assert traced["tokens"] == bare["tokens"]
    # vLLM's per-request processor stages, each timed (> 0), are the same with mmscope on.
    assert bare["vllm_stages"] and traced["vllm_stages"] == bare["vllm_stages"]
    assert all(all(d.values()) for d in bare["vllm_stages"])
    assert broken["vllm_stages"] == []
    assert broken["tokens"] == bare["tokens"]
    off = {h: s for h, s in broken["hooks"].items() if s.startswith("off: after error")}
    assert off, broken["hooks"]
    assert all("sabotaged ledger" in s for s in off.values())
    # One warning per failed hook, naming it.
    assert len(broken["warnings"]) == len(off)
    assert all(any(h in w for w in broken["warnings"]) for h in off)
