"""A trace written by the real torch profiler with Python stacks: its own records (operators,
Python functions, the `__enter__` frames a record_function range opens inside) are no ranges, so
the ranges a program named nest, while two ranges closed out of order still fail the check."""
from __future__ import annotations

import subprocess
import sys

import pytest

from mmscope.analyze.ranges import checks
from mmscope.analyze import load

# One process: a range through a wrapper (as mmscope's stage timer opens one), vLLM's plain
# `with record_function(...)`, a range inside a range, and, with `crossed`, two ranges closed
# out of order (b opens inside a, a closes first).
SCRIPT = r"""
import contextlib, sys, torch
from torch.profiler import ProfilerActivity, profile, record_function

class Timed:
    def __init__(self, name):
        self.inner = record_function(name)
    def __enter__(self):
        self.inner.__enter__()
    def __exit__(self, *exc):
        self.inner.__exit__(*exc)

def work():
    return torch.ones(64, 64) @ torch.ones(64, 64)

with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
    for _ in range(3):
        with Timed("mm:processor:hf_processor"):
            work()
        with record_function("gpu_model_runner: preprocess"):
            with record_function("gpu_model_runner: vit_forward"):
                work()
    if sys.argv[2] == "crossed":
        a, b = record_function("a"), record_function("b")
        a.__enter__(); work(); b.__enter__(); work(); a.__exit__(None, None, None)
        work(); b.__exit__(None, None, None)
prof.export_chrome_trace(sys.argv[1])
"""


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    out = {}
    for kind in ("nested", "crossed"):
        path = tmp_path_factory.mktemp("torch") / f"{kind}.json"
        done = subprocess.run([sys.executable, "-c", SCRIPT, str(path), kind],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        out[kind] = load(str(path))
    return out


def nest_check(table) -> dict:
    return checks.ranges_nest(table)


def test_only_the_named_ranges_are_read(traces):
    table = traces["nested"]
    names = sorted(table.name_of(i) for i in range(len(table)))
    assert names == sorted(["mm:processor:hf_processor", "gpu_model_runner: preprocess",
                            "gpu_model_runner: vit_forward"] * 3)
    assert nest_check(table)["ok"], nest_check(table)


def test_ranges_closed_out_of_order_still_fail(traces):
    table = traces["crossed"]
    check = nest_check(table)
    assert not check["ok"]
    assert check["detail"].startswith("1 of "), check
    assert "first: 'b' [" in check["detail"]


def test_a_recorded_range_nests_in_the_range_around_it(traces):
    table = traces["nested"]
    pre = table.rows_named("gpu_model_runner: preprocess")
    vit = table.rows_named("gpu_model_runner: vit_forward")
    assert len(pre) == len(vit) == 3
    assert sorted(table.parent[vit].tolist()) == sorted(pre.tolist())


def test_a_cpu_trace_has_no_device_side(traces):
    table = traces["nested"]
    assert table.device is None
    assert "ProfilerActivity.CUDA" in table.no_device
