"""The vLLM releases mmscope vouches for: the 0.33.0 and 0.34.0 wheels' sources read with ast, never
installed nor imported, and the installed 0.32 sources read the same way, where the check is made to
fail; and whether the table covers the newest release on the package index.

The wheels (about 240-340 MB each) are downloaded once into the cache named by
release_check.wheel_cache().
"""
import copy
import json
import re
import subprocess
import sys
from typing import NamedTuple

import pytest

from mmscope.doctor import command as doctor
from mmscope.doctor import release_check as rc
from mmscope.vllm import releases

SCHED = "vllm.v1.core.sched.scheduler"


class Target(NamedTuple):
    name: str
    path: str
    params: tuple
    releases: str = ""


@pytest.fixture(scope="module")
def wheel_033():
    return rc.Sources.from_wheel(rc.fetch_wheel("0.33.0"))


@pytest.fixture(scope="module")
def wheel_034():
    return rc.Sources.from_wheel(rc.fetch_wheel("0.34.0"))


@pytest.fixture(scope="module")
def installed():
    return rc.Sources.installed()


def test_every_hook_target_is_in_vllm_033s_sources(wheel_033):
    result = rc.check_release(wheel_033)
    assert result.version == "0.33.0"
    assert result.ok, result.summary()
    assert [v.name for v in result.verdicts] == [h.name for h in rc.hooks()]
    assert len(result.verdicts) >= 20


def test_every_hook_target_of_vllm_034_is_in_its_sources_and_v1s_are_not_in_it(wheel_034):
    """0.34 removed Model Runner V1: its rows are "not in this release", never failures; every
    other row's target is there with the parameters its wrapper receives."""
    result = rc.check_release(wheel_034)
    assert result.version == "0.34.0"
    assert result.ok, result.summary()
    absent = {v.name for v in result.verdicts if not v.in_release}
    assert absent == {h.name for h in rc.hooks() if h.runner == "v1"} and len(absent) >= 9
    assert (f"all {len(result.verdicts) - len(absent)} hook targets of this release present"
            in result.summary()) and f"{len(absent)} rows are not in this release" in result.summary()


def test_the_table_covers_the_newest_vllm_release_on_the_package_index():
    """Says which vLLM is newest where pip installs from, and fails when the table neither tests
    nor checks it: a new release is the next thing to support."""
    found = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "vllm",
                            "--disable-pip-version-check"], capture_output=True, text=True,
                           timeout=120)
    match = re.search(r"^vllm \(([^)]+)\)", found.stdout, re.M)
    if found.returncode != 0 or match is None:
        pytest.skip(f"the package index cannot be reached: {(found.stderr or found.stdout)[-200:]}")
    newest = match[1]
    print(f"newest vLLM on the package index: {newest}; table: {releases.standing(newest)}")
    assert releases.standing(newest) != "untested", (
        f"vLLM {newest} is out and mmscope neither tests nor checks it: add it to "
        "vllm/releases.py TESTED / SOURCE_CHECKED after checking its sources (docs/vllm-0.34.md)")


def test_every_hook_target_is_in_the_installed_032_sources(installed):
    result = rc.check_release(installed)
    assert result.version.startswith("0.32")
    assert result.ok, result.summary()


@pytest.mark.parametrize("path, params, says", [
    (f"{SCHED}:Scheduler._no_such_method", (), "Scheduler and its bases"),
    (f"{SCHED}:NoSuchScheduler.schedule", (), "NoSuchScheduler is not defined"),
    ("vllm.v1.core.sched.no_such_module:Scheduler.schedule", (), "module"),
    (f"{SCHED}:Scheduler._allocate_encoder_inputs", ("request", "input_id"),
     "expected parameters (request, input_id), found (self, request, input_ids,"),
    ("vllm.v1.request:Request.num_tokens", (), "is a property"),
    (f"{SCHED}:Scheduler.requests", (), "define no requests"),  # set in __init__
])
def test_a_moved_target_is_reported_with_the_hooks_name(installed, path, params, says):
    verdict = rc.check_hook(installed, Target("deliberately.wrong", path, params))
    assert not verdict.ok
    assert says in verdict.detail
    assert verdict.describe("0.32.0").startswith(f"deliberately.wrong ({path}): ")


def test_one_moved_target_fails_the_release_by_name(wheel_033):
    wrong = Target("deliberately.wrong", f"{SCHED}:Scheduler._try_schedule_encoder_input",
                   ("request",))
    result = rc.check_release(wheel_033, rc.hooks() + [wrong])
    assert not result.ok
    assert [v.name for v in result.failed] == ["deliberately.wrong"]
    assert "deliberately.wrong" in result.summary() and "vLLM 0.33.0" in result.summary()


def test_targets_are_found_through_bases_decorators_and_imports(installed):
    runner = "vllm.v1.worker.cpu_model_runner:CPUModelRunner"
    found = {t.name: rc.check_hook(installed, t) for t in [
        # inherited from GPUModelRunner, in another module
        Target("inherited", f"{runner}.execute_model", ("scheduler_output",)),
        # a staticmethod of a mixin base, two levels up
        Target("static", f"{runner}.maybe_save_ec_to_connector", ("encoder_cache", "mm_hash")),
        Target("classmethod", "vllm.multimodal.hasher:MultiModalHasher.hash_kwargs",
               ("algorithm", "kwargs")),
        # a module-level name the scheduler imports from vllm.v1.utils
        Target("imported", f"{SCHED}:record_function_or_nullcontext", ("name",)),
    ]}
    assert {n: v.ok for n, v in found.items()} == dict.fromkeys(found, True), found
    gpu = rc.check_hook(installed, Target(
        "gpu", "vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model", ()))
    assert found["inherited"].line == gpu.line


def test_the_source_check_agrees_with_the_imported_vllm(installed):
    """The ast reading and the import-time check of every hook of the installed release say the
    same, a wrong one too (rows of other releases are not in it, and not imported)."""
    from mmscope.vllm.patching import in_release

    moved, renamed = copy.copy(rc.hooks()[0]), copy.copy(rc.hooks()[0])
    moved.path += "_moved"
    renamed.params = (*renamed.params, "no_such_parameter")
    for hook in rc.hooks() + [moved, renamed]:
        if not in_release(hook, installed.version):
            assert not rc.check_hook(installed, hook).in_release
            continue
        imported_ok, detail = hook.check()
        assert rc.check_hook(installed, hook).ok == imported_ok, (hook.name, detail)
    assert not rc.check_hook(installed, moved).ok and not rc.check_hook(installed, renamed).ok


def test_doctor_says_which_releases_are_tested_and_which_checked(wheel_033, wheel_034, capsys,
                                                                 monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # one line per table row
    report = doctor.report()
    releases = {(r["version"], r["how"]): r for r in report["releases"]}
    assert releases["0.32.0", "tested"]["runners"] == ["Model Runner V1", "Model Runner V2"]
    assert releases["0.34.0", "tested"]["runners"] == ["Model Runner V2",
                                                      "Model Runner V2, standalone CPU runner"]
    for version in ("0.33.0", "0.34.0"):
        checked = releases[version, "checked against its sources"]
        assert checked["status"] == "ok" and checked["failed"] == []
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
