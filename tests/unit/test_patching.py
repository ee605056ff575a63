"""Hook mechanics: checked before wrapping, applied once, reverted, and never able to break the
wrapped code (our exceptions turn the hook off; the target's own pass through)."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from mmscope.vllm.patching import (APPLIED, MISMATCH, MISSING, NOT_APPLIED, OFF, Hook, failed,
                                   retire)


class Target:
    def work(self, x, y=1):
        if x < 0:
            raise ValueError("target's own error")
        return x + y

    def echo(self, x):
        return x

    @classmethod
    def cls_work(cls, x):
        return x * 2

    @staticmethod
    def static_work(x):
        return x * 3


ORIGINAL_WORK = Target.__dict__["work"]
seen: list = []


def recording(wrapped, instance, args, kwargs):
    """A wrapper as the plugin's are written: vLLM's call, then our code behind the guard."""
    result = wrapped(*args, **kwargs)
    seen.append((instance, args, kwargs, result))
    return result


def exploding(name):
    def wrapper(wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        try:
            seen.append("ours ran")
            raise RuntimeError("bug in mmscope")
        except Exception as e:  # noqa: BLE001 - the plugin's one-line guard
            failed(name, e)
        return result
    return wrapper


def hook(attr="work", wrapper=recording, params=("self", "x"), name=None):
    return Hook(name or f"test.{attr}", f"{__name__}:Target.{attr}", params, wrapper,
                "test", "test")


@pytest.fixture(autouse=True)
def fresh():
    seen.clear()
    yield
    assert Target.__dict__["work"] is ORIGINAL_WORK, "a test left Target.work wrapped"


def test_apply_observe_revert():
    h = hook()
    assert h.apply() == APPLIED
    target = Target()
    assert target.work(2) == 3
    assert seen == [(target, (2,), {}, 3)]
    assert h.apply() == APPLIED  # applied once: still one wrapper
    target.work(1)
    assert len(seen) == 2
    h.revert()
    assert Target.__dict__["work"] is ORIGINAL_WORK and h.describe() == NOT_APPLIED
    target.work(1)
    assert len(seen) == 2


def test_classmethod_and_staticmethod_keep_their_kind():
    hc = hook("cls_work", params=("cls", "x"))
    hs = hook("static_work", params=("x",))
    assert hc.apply() == APPLIED and hs.apply() == APPLIED
    try:
        assert Target.cls_work(2) == 4 and Target().cls_work(3) == 6
        assert Target.static_work(2) == 6 and Target().static_work(1) == 3
        # wrapt binds like the descriptor it wraps: the class for a classmethod, none for static
        assert [s[0] for s in seen] == [Target, Target, None, None]
        assert [s[3] for s in seen] == [4, 6, 6, 3]
    finally:
        hc.revert(), hs.revert()
    assert isinstance(Target.__dict__["cls_work"], classmethod)
    assert isinstance(Target.__dict__["static_work"], staticmethod)
    assert Target.cls_work(1) == 2 and Target.static_work(1) == 3 and len(seen) == 4


def test_missing_target_and_signature_mismatch_are_reported(caplog):
    missing = hook("gone", params=("self",))
    with caplog.at_level(logging.WARNING, logger="vllm.mmscope"):
        assert missing.apply() == MISSING
    assert "mmscope: cannot hook test.gone" in caplog.text and "AttributeError" in missing.detail
    no_module = Hook("test.no_module", "mmscope_no_such_module:X.y", ("self",), recording,
                     "test", "test")
    assert no_module.check() == (False, no_module.detail) and no_module.status == MISSING
    wrong = hook(params=("self", "request"))
    assert wrong.apply() == MISMATCH
    assert wrong.detail == "expected (self, request, ...), found (self, x, y)"
    assert wrong.describe() == f"signature mismatch: {wrong.detail}"
    assert Target.__dict__["work"] is ORIGINAL_WORK  # nothing was wrapped
    optional = hook(params=("self", "request"), name="test.optional")
    optional.required = False
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vllm.mmscope"):
        assert optional.apply() == MISMATCH
    assert [r.levelno for r in caplog.records] == [logging.INFO]  # optional: not a warning


def test_arguments_and_results_pass_through_unchanged():
    h, echo = hook(), hook("echo")
    h.apply(), echo.apply()
    try:
        target = Target()
        assert target.work(2, y=5) == 7 and target.work(x=1) == 2
        assert Target.work(target, 3) == 4  # called through the class, unbound
        assert [(s[0], s[1], s[2], s[3]) for s in seen] == [
            (target, (2,), {"y": 5}, 7), (target, (), {"x": 1}, 2), (target, (3,), {}, 4)]
        assert Target.work.__name__ == "work" and Target.work.__wrapped__ is ORIGINAL_WORK
        payload = {"items": [1, 2]}
        assert target.echo(payload) is payload  # the very object, not a copy
        assert seen[-1][1][0] is payload and payload == {"items": [1, 2]}
    finally:
        echo.revert(), h.revert()


def test_the_targets_own_exception_passes_through_untouched():
    h = hook()
    h.apply()
    try:
        with pytest.raises(ValueError, match="target's own error") as raised:
            Target().work(-1)
        assert type(raised.value) is ValueError and seen == []
        assert h.status == APPLIED  # vLLM's error is not ours: the hook stays on
        assert Target().work(1) == 2 and len(seen) == 1
    finally:
        h.revert()


def test_an_exception_of_ours_turns_the_hook_off_once_and_puts_the_original_back(caplog):
    h = hook(wrapper=exploding("test.explode"), name="test.explode")
    h.apply()
    try:
        with caplog.at_level(logging.WARNING, logger="vllm.mmscope"):
            assert Target().work(1) == 2  # the result is untouched
            assert Target.__dict__["work"] is ORIGINAL_WORK
            assert Target().work(2) == 3  # vLLM's original now: our code no longer runs
        assert seen == ["ours ran"]
        warnings = [r.getMessage() for r in caplog.records
                    if r.levelno == logging.WARNING and r.name == "vllm.mmscope"]
        assert warnings == ["mmscope: hook test.explode raised RuntimeError: bug in mmscope; "
                            "it is now off and vLLM continues without it"]
        assert h.status == OFF and h.describe() == "off: after error: RuntimeError: bug in mmscope"
        failed("test.explode", RuntimeError("again"))  # a second thread raising late: no-op
        assert len([r for r in caplog.records if r.name == "vllm.mmscope"]) == 1
    finally:
        h.revert()


def test_a_keyboard_interrupt_inside_is_not_swallowed():
    def interrupting(wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        try:
            raise KeyboardInterrupt
        except Exception as e:  # noqa: BLE001 - the plugin's guard, which must not catch it
            failed("test.interrupt", e)
        return result

    h = hook(wrapper=interrupting, name="test.interrupt")
    h.apply()
    try:
        with pytest.raises(KeyboardInterrupt):
            Target().work(1)
        assert h.status == APPLIED  # not taken for a bug of ours
    finally:
        h.revert()


def test_a_hook_turned_off_can_be_applied_again():
    h = hook(wrapper=exploding("test.again"), name="test.again")
    h.apply()
    Target().work(1)
    assert h.status == OFF
    assert h.apply() == APPLIED and Target.__dict__["work"] is not ORIGINAL_WORK
    h.revert()


def test_a_retired_hook_puts_the_original_back_without_a_word(caplog):
    h = hook()
    h.apply()
    with caplog.at_level(logging.DEBUG, logger="vllm.mmscope"):
        retire("test.work", "nothing to do here")
    assert Target.__dict__["work"] is ORIGINAL_WORK
    assert h.describe() == "retired: nothing to do here"
    assert not [r for r in caplog.records if r.name == "vllm.mmscope"]
    assert h.apply() == APPLIED and Target().work(1) == 2 and len(seen) == 1  # applied again
    h.revert()


def doctor(*args, **env):
    out = subprocess.run([sys.executable, "-m", "mmscope.cli", "doctor", *args],
                         capture_output=True, text=True, env={**os.environ, **env})
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_doctor_checks_every_hook_against_the_installed_vllm():
    """`mmscope doctor` imports vLLM but starts no engine: every hook's target is there, with
    the parameters its wrapper reads; the tracing-only ones too, as the releases' check counts."""
    data = json.loads(doctor("--json"))
    assert data["vllm_version"].startswith("0.32") and data["version_supported"]
    assert data["entry_point"]
    assert {h["name"]: h["status"] for h in data["hooks"]} == {
        h["name"]: "ok" for h in data["hooks"]}
    from mmscope.vllm import release_check
    assert [h["name"] for h in data["hooks"]] == [h.name for h in release_check.hooks()]


@pytest.mark.parametrize("forced, runner, other", [("0", "v1", "v2"), ("1", "v2", "v1")])
def test_doctor_names_the_model_runner_and_which_hooks_apply_to_it(forced, runner, other):
    """What vLLM picks here (VLLM_USE_V2_MODEL_RUNNER decides before Triton does); the other
    runner's hooks are reported as not applying, never as ok, and the summary counts the hooks
    the releases' check counts."""
    data = json.loads(doctor("--json", VLLM_USE_V2_MODEL_RUNNER=forced))
    assert data["runner"] == {"expected": runner, "why": f"VLLM_USE_V2_MODEL_RUNNER={forced}"}
    applies = {h["name"]: h["applies"] for h in data["hooks"]}
    assert applies["ranges.vit_forward"] is (runner == "v1")
    assert applies["ranges.vit_forward.v2"] is (runner == "v2")
    assert applies["scheduler.commit"] and applies["ranges.ec_connector"]
    assert {h["runner"] for h in data["hooks"] if not h["applies"]} == {other}
    text = doctor(VLLM_USE_V2_MODEL_RUNNER=forced, COLUMNS="200")
    label = "Model Runner " + runner.upper()
    assert f"model runner here: {label} (VLLM_USE_V2_MODEL_RUNNER={forced})" in text
    n, mine = len(data["hooks"]), sum(applies.values())
    assert (f"{n} of {n} hook targets present in the installed vLLM; {mine} of the {mine} hooks "
            f"that apply to {label} ok; {n - mine} are the other runner's, not used here") in text
    assert f"ok: all {n} hook targets present" in text or "not checked" in text
    assert text.count("present; not this runner") == n - mine


def test_doctor_without_the_switch_names_vllms_own_choice():
    env = {k: v for k, v in os.environ.items() if k != "VLLM_USE_V2_MODEL_RUNNER"}
    out = subprocess.run([sys.executable, "-m", "mmscope.cli", "doctor", "--json"],
                         capture_output=True, text=True, env=env)
    runner = json.loads(out.stdout)["runner"]
    from vllm.triton_utils.importing import HAS_TRITON
    assert runner["expected"] == ("v2" if HAS_TRITON else "v1")
    assert "Triton" in runner["why"]


def test_every_hook_and_vllm_scope_hook_checks_ok_in_process():
    from mmscope.vllm import targets

    for h in targets.all_hooks() + targets.vllm_scope_hooks() + targets.otlp_request_hooks():
        assert h.check() == (True, ""), (h.name, h.detail)


class Unweakable:
    """A stat logger mmscope cannot key weakly: its lookup fails in mmscope's own code."""

    __slots__ = ("calls",)

    def __init__(self):
        self.calls = 0

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
        self.calls += 1


def test_a_plugin_wrapper_that_raises_puts_vllms_method_back(caplog):
    """The real stat_loggers.record hook on vLLM's StatLoggerManager: vLLM's loop has run for
    every logger when ours fails; the hook turns off, and the next step is vLLM's alone."""
    from types import SimpleNamespace as NS

    from vllm.v1.metrics.loggers import StatLoggerManager

    from mmscope.vllm import targets

    original = StatLoggerManager.__dict__["record"]
    hook = next(h for h in targets.metrics_hooks() if h.name == "stat_loggers.record")
    assert hook.apply() == APPLIED
    try:
        manager = object.__new__(StatLoggerManager)
        manager.stat_loggers = [Unweakable()]
        stats = NS(encoder_cache_stats={"queries": 1}, mm_stage_durations=None,
                   mm_request_shares=None, mm_ec_transfers=None)
        with caplog.at_level(logging.WARNING, logger="vllm.mmscope"):
            for _ in range(2):
                manager.record(scheduler_stats=stats, iteration_stats=None, engine_idx=0)
        assert manager.stat_loggers[0].calls == 2  # vLLM's own work, both times
        assert StatLoggerManager.__dict__["record"] is original and hook.status == OFF
        warnings = [r.getMessage() for r in caplog.records
                    if r.levelno == logging.WARNING and r.name == "vllm.mmscope"]
        assert len(warnings) == 1 and warnings[0].startswith(
            "mmscope: hook stat_loggers.record raised TypeError: ")
    finally:
        hook.revert()
