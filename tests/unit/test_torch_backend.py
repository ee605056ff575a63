"""The torch backend: spans as torch.profiler.record_function ranges, in the trace a real
torch.profiler.profile() exports (what vLLM's own --profiler-config writes)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from mmscope.emit import tracing

# A program that profiles nested spans twice and exports the trace (torch's profiler records the
# ranges of the thread that started it: vLLM's step runs there).
PROFILED = textwrap.dedent("""
    import json, sys
    import torch
    from torch.profiler import ProfilerActivity, profile
    from mmscope.emit import tracing

    def work():
        with tracing.span("outer"):
            torch.ones(64).sum()
            with tracing.span("inner"):
                torch.ones(64).sum()
                tracing.mark("step_meta: prefill=1 decode=0 total=1 reqs=1")

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        work()
        work()
    prof.export_chrome_trace(sys.argv[1])
    print(json.dumps(tracing.active()))
""")


def annotations(path) -> list[dict]:
    with open(path) as f:
        doc = json.load(f)
    return sorted((e for e in doc["traceEvents"]
                   if e.get("ph") == "X" and e.get("cat") == "user_annotation"),
                  key=lambda e: (e["ts"], -e["dur"]))


def within(inner: dict, outer: dict) -> bool:
    return (inner["pid"], inner["tid"]) == (outer["pid"], outer["tid"]) and \
        outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]


def profiled(tmp_path, **env) -> list[dict]:
    path = tmp_path / "torch.trace.json"
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("MMSCOPE_TRACE", "VLLM_CUSTOM_SCOPES_FOR_PROFILING")}
    out = subprocess.run([sys.executable, "-c", PROFILED, str(path)], capture_output=True,
                         text=True, env=dict(environment, **env))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == ["torch"]
    return annotations(path)


def check_nesting(events: list[dict]) -> None:
    names = [e["name"] for e in events]
    mark = "step_meta: prefill=1 decode=0 total=1 reqs=1"
    assert names == ["outer", "inner", mark] * 2
    for k in (0, 3):
        outer, inner, marked = events[k:k + 3]
        assert within(inner, outer) and within(marked, inner)
    assert not within(events[3], events[0])  # two calls, one after the other


def test_mmscope_trace_torch_puts_spans_into_a_torch_profiler_trace(tmp_path):
    check_nesting(profiled(tmp_path, MMSCOPE_TRACE="torch"))


def test_vllms_custom_scopes_switch_turns_the_torch_backend_on(tmp_path):
    check_nesting(profiled(tmp_path, VLLM_CUSTOM_SCOPES_FOR_PROFILING="1"))


@pytest.fixture
def torch_tracing():
    tracing.configure("torch")
    yield
    tracing.configure("off")


def test_an_exception_closes_the_range(tmp_path, torch_tracing):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with pytest.raises(KeyError):
            with tracing.span("outer"):
                with tracing.span("boom"):
                    raise KeyError("vLLM's own error")
        with tracing.span("after"):
            pass
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    events = annotations(tmp_path / "t.json")
    outer, boom, after = events
    assert [e["name"] for e in events] == ["outer", "boom", "after"]
    assert within(boom, outer) and not within(after, outer)


def test_vllms_own_scopes_go_through_the_torch_backend_once(tmp_path, torch_tracing):
    """With mmscope tracing, vLLM's record_function_or_nullcontext scopes are mmscope spans: in
    the torch trace once each, with mmscope's stages inside."""
    from torch.profiler import ProfilerActivity, profile
    from vllm.v1.worker import gpu_model_runner

    from mmscope.vllm import targets

    hook = targets.TABLE.by_name["ranges.vllm_scopes.runner"]
    assert hook.apply() == "applied"
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            with gpu_model_runner.record_function_or_nullcontext("gpu_model_runner: preprocess"):
                with tracing.span("gpu_model_runner: vit_forward"):
                    pass
    finally:
        hook.revert()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    events = annotations(tmp_path / "t.json")
    assert [e["name"] for e in events] == ["gpu_model_runner: preprocess",
                                           "gpu_model_runner: vit_forward"]
    assert within(events[1], events[0])


def test_chrome_and_torch_together_hold_the_same_tree(tmp_path):
    from torch.profiler import ProfilerActivity, profile

    from tests.kit import traces as tk

    assert tracing.configure("chrome,torch", str(tmp_path / "chrome")) == ("chrome", "torch")
    try:
        def work(x):
            with tracing.span("decorated"), tracing.span("inner"):
                return x * 2

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            with tracing.span("outer"):
                assert work(2) == 4
        tracing.flush()
    finally:
        tracing.configure("off")
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    torch_events = annotations(tmp_path / "t.json")
    assert [e["name"] for e in torch_events] == ["outer", "decorated", "inner"]
    assert within(torch_events[1], torch_events[0]) and within(torch_events[2], torch_events[1])
    chrome_ranges = tk.load(tmp_path / "chrome")[0]
    assert [r.name for r in chrome_ranges] == ["outer", "decorated", "inner"]
    assert tk.within(chrome_ranges[1], chrome_ranges[0])
    assert tk.within(chrome_ranges[2], chrome_ranges[1])
