"""The vLLM releases mmscope vouches for: the 0.33.0 wheel's sources read with ast, never installed
nor imported, and the installed 0.32 sources read the same way, where the check is made to fail.

The wheel (about 340 MB) is downloaded once into the cache named by release_check.wheel_cache().
"""
import copy
import json
from typing import NamedTuple

import pytest

from mmscope.vllm import doctor
from mmscope.vllm import release_check as rc

SCHED = "vllm.v1.core.sched.scheduler"


class Target(NamedTuple):
    name: str
    path: str
    params: tuple


@pytest.fixture(scope="module")
def wheel_033():
    return rc.Sources.from_wheel(rc.fetch_wheel("0.33.0"))


@pytest.fixture(scope="module")
def installed():
    return rc.Sources.installed()


def test_every_hook_target_is_in_vllm_033s_sources(wheel_033):
    result = rc.check_release(wheel_033)
    assert result.version == "0.33.0"
    assert result.ok, result.summary()
    assert [v.name for v in result.verdicts] == [h.name for h in rc.hooks()]
    assert len(result.verdicts) >= 20


def test_every_hook_target_is_in_the_installed_032_sources(installed):
    result = rc.check_release(installed)
    assert result.version.startswith("0.32")
    assert result.ok, result.summary()


@pytest.mark.parametrize("path, params, says", [
    (f"{SCHED}:Scheduler._no_such_method", ("self",), "Scheduler and its bases"),
    (f"{SCHED}:NoSuchScheduler.schedule", ("self",), "NoSuchScheduler is not defined"),
    ("vllm.v1.core.sched.no_such_module:Scheduler.schedule", ("self",), "module"),
    (f"{SCHED}:Scheduler._allocate_encoder_inputs", ("self", "request", "input_id"),
     "expected (self, request, input_id, ...), found (self, request, input_ids,"),
    ("vllm.v1.request:Request.num_tokens", ("self",), "is a property"),
    (f"{SCHED}:Scheduler.requests", ("self",), "define no requests"),  # set in __init__
])
def test_a_moved_target_is_reported_with_the_hooks_name(installed, path, params, says):
    verdict = rc.check_hook(installed, Target("deliberately.wrong", path, params))
    assert not verdict.ok
    assert says in verdict.detail
    assert verdict.describe("0.32.0").startswith(f"deliberately.wrong ({path}): ")


def test_one_moved_target_fails_the_release_by_name(wheel_033):
    wrong = Target("deliberately.wrong", f"{SCHED}:Scheduler._try_schedule_encoder_input",
                   ("self", "request"))
    result = rc.check_release(wheel_033, rc.hooks() + [wrong])
    assert not result.ok
    assert [v.name for v in result.failed] == ["deliberately.wrong"]
    assert "deliberately.wrong" in result.summary() and "vLLM 0.33.0" in result.summary()


def test_targets_are_found_through_bases_decorators_and_imports(installed):
    runner = "vllm.v1.worker.cpu_model_runner:CPUModelRunner"
    found = {t.name: rc.check_hook(installed, t) for t in [
        # inherited from GPUModelRunner, in another module
        Target("inherited", f"{runner}.execute_model", ("self", "scheduler_output")),
        # a staticmethod of a mixin base, two levels up
        Target("static", f"{runner}.maybe_save_ec_to_connector", ("encoder_cache", "mm_hash")),
        Target("classmethod", "vllm.multimodal.hasher:MultiModalHasher.hash_kwargs",
               ("cls", "algorithm")),
        # a module-level name the scheduler imports from vllm.v1.utils
        Target("imported", f"{SCHED}:record_function_or_nullcontext", ("name",)),
    ]}
    assert {n: v.ok for n, v in found.items()} == dict.fromkeys(found, True), found
    gpu = rc.check_hook(installed, Target(
        "gpu", "vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model", ("self",)))
    assert found["inherited"].line == gpu.line


def test_the_source_check_agrees_with_the_imported_vllm(installed):
    """The ast reading and the import-time check of every hook say the same, a wrong one too."""
    moved, renamed = copy.copy(rc.hooks()[0]), copy.copy(rc.hooks()[0])
    moved.path += "_moved"
    renamed.params = (*renamed.params, "no_such_parameter")
    for hook in rc.hooks() + [moved, renamed]:
        imported_ok, detail = hook.check()
        assert rc.check_hook(installed, hook).ok == imported_ok, (hook.name, detail)
    assert not rc.check_hook(installed, moved).ok and not rc.check_hook(installed, renamed).ok


def test_doctor_says_which_releases_are_tested_and_which_checked(wheel_033, capsys):
    report = doctor.report()
    releases = {r["version"]: r for r in report["releases"]}
    assert releases["0.32.0"]["how"] == "tested"
    assert releases["0.33.0"]["how"] == "checked against its sources"
    assert releases["0.33.0"]["status"] == "ok" and releases["0.33.0"]["failed"] == []
    assert report["standing"] == "tested"  # the installed 0.32.0
    json.dumps(report)

    assert doctor.run(doctor_args(json=False)) == 0
    out = capsys.readouterr().out
    assert "vLLM 0.32.0: tested" in out and "checked against its sources" in out
    assert "ok: all" in out


def test_doctor_says_how_to_fetch_a_wheel_not_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    checked = [r for r in rc.releases_report() if r["version"] == "0.33.0"]
    assert checked[0]["status"] == "not checked"
    assert checked[0]["detail"] == (
        "wheel not in the cache: pip download vllm==0.33.0 --no-deps --only-binary=:all: "
        f"--platform {rc.WHEEL_PLATFORM} -d {tmp_path / 'mmscope' / 'wheels'}")


def doctor_args(json: bool):
    import argparse

    p = argparse.ArgumentParser()
    doctor.add_arguments(p)
    return p.parse_args(["--json"] if json else [])
