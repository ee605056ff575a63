"""The checks of docs/design.md §6: they pass on a sound profile and each fails, with a useful detail,
on a profile that breaks it."""
from __future__ import annotations

import pytest

from tests.kit import nsys as F
from mmscope import stages
from mmscope.analyze.ranges import checks, frame, steps
from mmscope.analyze.readers import nsys


def run_checks(path) -> dict[str, dict]:
    built = frame.build(nsys.load(str(path)))
    return {c["name"]: c for c in checks.run_all(built, steps.step_join(built))}


def one_step(f, vit=(110, 150), save=(150, 160), meta=True, forward=True, pid=7):
    if meta:
        f.range(stages.step_meta_range(stages.StepShape(3, 0, 3, 1)), 90, 90, pid=pid)
    f.range(stages.PREPROCESS, 100, 200, pid=pid)
    f.range(stages.VIT_FORWARD, *vit, pid=pid)
    f.range(stages.EC_SAVE, *save, pid=pid)
    if forward:
        f.range(stages.FORWARD, 210, 300, pid=pid)


def find(results: dict, start: str) -> dict:
    (hit,) = [c for name, c in results.items() if name.startswith(start)]
    return hit


def test_pipeline_passes_every_check(tmp_path):
    results = run_checks(F.pipeline_file(tmp_path / "p.sqlite"))
    assert len(results) == 5
    assert all(c["ok"] for c in results.values()), results
    assert find(results, stages.VIT_FORWARD)["detail"] == "all 2 'ec_connector: save' ranges pass"


def test_save_inside_vit_forward_fails(tmp_path):
    path = tmp_path / "nested.sqlite"
    with F.NsysFile(path) as f:
        f.thread_name("worker-7", 7, 7)
        one_step(f, vit=(110, 180), save=(150, 160))
    c = find(run_checks(path), stages.VIT_FORWARD)
    assert not c["ok"]
    assert c["detail"] == (
        "1 of 1 'ec_connector: save' ranges fail; first: 'ec_connector: save' [150, 160] ns on "
        "pid 7 tid 7 (worker-7) inside 'gpu_model_runner: vit_forward' [110, 180] ns on pid 7 "
        "tid 7 (worker-7)")


def test_overlapping_siblings_fail(tmp_path):
    path = tmp_path / "overlap.sqlite"
    with F.NsysFile(path) as f:
        one_step(f, vit=(110, 155), save=(150, 160))  # overlap without containment
    results = run_checks(path)
    assert find(results, stages.VIT_FORWARD)["ok"]
    c = find(results, "preprocess children are disjoint")
    assert not c["ok"]
    assert "1 of 2 preprocess child ranges fail" in c["detail"]
    assert "'ec_connector: save' [150, 160] ns on pid 7 tid 7 overlaps " \
           "'gpu_model_runner: vit_forward' [110, 155]" in c["detail"]


def test_touching_siblings_pass(tmp_path):
    path = tmp_path / "touch.sqlite"
    with F.NsysFile(path) as f:
        one_step(f, vit=(110, 150), save=(150, 160))
    assert find(run_checks(path), "preprocess children are disjoint")["ok"]


def test_sibling_outside_preprocess_fails(tmp_path):
    path = tmp_path / "outside.sqlite"
    with F.NsysFile(path) as f:
        one_step(f, vit=(110, 150), save=(195, 205))
    c = find(run_checks(path), "preprocess children lie inside")
    assert not c["ok"]
    assert c["detail"].endswith("first: 'ec_connector: save' [195, 205] ns on pid 7 tid 7")


def test_step_meta_without_forward_fails(tmp_path):
    """A step whose forward is missing while its thread goes on (another step follows)."""
    path = tmp_path / "meta.sqlite"
    with F.NsysFile(path) as f:
        one_step(f, forward=False)
        f.range(stages.step_meta_range(stages.StepShape(0, 1, 1, 1)), 400, 400, pid=7)
        f.range(stages.FORWARD, 410, 500, pid=7)
    c = find(run_checks(path), "every step_meta")
    assert not c["ok"]
    assert c["detail"] == ("1 of 2 step_meta ranges fail; first: 'step_meta: prefill=3 decode=0 "
                           "total=3 reqs=1' [90, 90] ns on pid 7 tid 7")


def test_the_last_step_of_a_cut_trace_is_no_failed_join(tmp_path):
    """The process stopped inside its last step: that step_meta has no forward after it."""
    path = tmp_path / "cut.sqlite"
    with F.NsysFile(path) as f:
        one_step(f)
        f.range(stages.step_meta_range(stages.StepShape(0, 1, 1, 1)), 400, 400, pid=7)
        f.range(stages.PREPROCESS, 390, 450, pid=7)
    c = find(run_checks(path), "every step_meta")
    assert c["ok"], c
    assert c["detail"] == ("all 2 step_meta ranges pass; 1 ends its thread's trace before its "
                           "forward (the trace was cut inside that step)")


@pytest.mark.parametrize("start", ["preprocess children lie inside", "every step_meta"])
def test_checks_without_their_ranges_pass(tmp_path, start):
    path = tmp_path / "bare.sqlite"
    with F.NsysFile(path) as f:
        f.range("something else", 0, 10)
    c = find(run_checks(path), start)
    assert c["ok"] and ("no " in c["detail"])
