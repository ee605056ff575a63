"""A trace written by the real torch profiler with Python stacks: each record_function range
overlaps the frames that open and close it (by the profiler's design, not a failed nesting),
while two ranges closed out of order still fail the check."""
from __future__ import annotations

import subprocess
import sys

import pytest

from mmscope.analyze import checks, load

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


def test_record_function_against_its_own_frames_passes(traces):
    table = traces["nested"]
    assert len(table.crossing) >= 6  # the profiler's frames do overlap its ranges partly
    assert len(table.own_overlaps) == len(table.crossing)
    check = nest_check(table)
    assert check["ok"], check
    assert f"; {len(table.own_overlaps)} more overlap only as torch's record_function" \
        in check["detail"]


def test_ranges_closed_out_of_order_still_fail(traces):
    table = traces["crossed"]
    check = nest_check(table)
    assert not check["ok"]
    assert check["detail"].startswith("1 of "), check
    assert "first: 'b' [" in check["detail"]


def test_a_recorded_range_nests_in_its_caller_not_its_enter_frame(traces):
    from mmscope.analyze.table import enclosing
    from mmscope.analyze.torch_frames import ENTER

    table = traces["nested"]
    pre = table.rows_named("gpu_model_runner: preprocess")
    vit = table.rows_named("gpu_model_runner: vit_forward")
    assert len(pre) == len(vit) == 3
    assert (enclosing(table, pre, vit) >= 0).all()
    for row in pre.tolist() + vit.tolist():
        assert not ENTER.search(table.name_of(int(table.parent[row])))
