"""Hook mechanics: checked before wrapping, arguments bound by the row's names, applied once,
reverted, and never able to break the wrapped code (our exceptions turn the hook off, on record;
the target's own pass through)."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from mmscope.vllm.patching import TURNED_OFF, Hook, Status, Table, When


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


def recording(hook, wrapped, instance, args, kwargs, *params):
    """A wrapper as the plugin's are written: vLLM's call, then our code behind the guard."""
    result = wrapped(*args, **kwargs)
    seen.append((instance, args, kwargs, result, params))
    return result


def exploding(hook, wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    try:
        seen.append("ours ran")
        raise RuntimeError("bug in mmscope")
    except Exception as e:  # noqa: BLE001 - the plugin's one-line guard
        hook.failed(e)
    return result


def hook(attr="work", wrapper=recording, params=(), name=None):
    return Hook(name or f"test.{attr}", f"{__name__}:Target.{attr}", params, wrapper,
                "test", "test")


@pytest.fixture(autouse=True)
def fresh():
    seen.clear()
    yield
    assert Target.__dict__["work"] is ORIGINAL_WORK, "a test left Target.work wrapped"


def test_apply_observe_revert():
    h = hook()
    assert h.apply() is Status.APPLIED
    target = Target()
    assert target.work(2) == 3
    assert seen == [(target, (2,), {}, 3, ())]
    assert h.apply() is Status.APPLIED  # applied once: still one wrapper
    target.work(1)
    assert len(seen) == 2
    h.revert()
    assert Target.__dict__["work"] is ORIGINAL_WORK and h.describe() == "not applied"
    target.work(1)
    assert len(seen) == 2


def test_the_wrapper_receives_the_rows_params_by_name_however_they_are_passed():
    """Positional, by keyword, or left to the target's default: the wrapper sees the values
    the target gets, in the row's order, never a position read by hand."""
    h = hook(params=("y", "x"))
    h.apply()
    try:
        target = Target()
        assert target.work(2, 5) == 7 and target.work(2, y=6) == 8 and target.work(x=3) == 4
        assert Target.work(target, 1, 2) == 3  # through the class: self is still not a param
        assert [s[4] for s in seen] == [(5, 2), (6, 2), (1, 3), (2, 1)]
    finally:
        h.revert()


def test_keyword_only_positional_only_and_var_keyword_params_bind_too():
    class Shapes:
        def kw(self, a, *, flag=False):
            return flag

        @classmethod
        def pos(cls, algorithm, /, **items):
            return sorted(items)

    made = []
    for attr, params in (("kw", ("flag",)), ("pos", ("algorithm", "items"))):
        row = Hook(f"test.{attr}", f"{__name__}:Target.{attr}", params, recording, "test", "test")
        setattr(Target, attr, Shapes.__dict__[attr])
        assert row.apply() is Status.APPLIED, row.describe()
        made.append(row)
    try:
        assert Target().kw(1) is False and Target().kw(1, flag=True) is True
        assert Target.pos("sha256", image=1, video=2) == ["image", "video"]
        assert [s[4] for s in seen] == [(False,), (True,), ("sha256", {"image": 1, "video": 2})]
    finally:
        for row in made:
            row.revert()
        del Target.kw, Target.pos


def test_classmethod_and_staticmethod_keep_their_kind():
    hc = hook("cls_work", params=("x",))
    hs = hook("static_work", params=("x",))
    assert hc.apply() is Status.APPLIED and hs.apply() is Status.APPLIED
    try:
        assert Target.cls_work(2) == 4 and Target().cls_work(3) == 6
        assert Target.static_work(2) == 6 and Target().static_work(1) == 3
        # wrapt binds like the descriptor it wraps: the class for a classmethod, none for static
        assert [s[0] for s in seen] == [Target, Target, None, None]
        assert [s[3] for s in seen] == [4, 6, 6, 3]
        assert [s[4] for s in seen] == [(2,), (3,), (2,), (1,)]
    finally:
        hc.revert(), hs.revert()
    assert isinstance(Target.__dict__["cls_work"], classmethod)
    assert isinstance(Target.__dict__["static_work"], staticmethod)
    assert Target.cls_work(1) == 2 and Target.static_work(1) == 3 and len(seen) == 4


def test_missing_target_and_signature_mismatch_are_reported(caplog):
    missing = hook("gone")
    with caplog.at_level(logging.WARNING, logger="vllm.mmscope"):
        assert missing.apply() is Status.MISSING
    assert "mmscope: cannot hook test.gone" in caplog.text and "AttributeError" in missing.detail
    no_module = Hook("test.no_module", "mmscope_no_such_module:X.y", (), recording,
                     "test", "test")
    assert no_module.check() == (False, no_module.detail) and no_module.status is Status.MISSING
    wrong = hook(params=("x", "request"))
    assert wrong.apply() is Status.MISMATCH
    assert wrong.detail == "expected parameters (x, request), found (self, x, y)"
    assert wrong.describe() == f"signature mismatch: {wrong.detail}"
    assert Target.__dict__["work"] is ORIGINAL_WORK  # nothing was wrapped
    optional = hook(params=("request",), name="test.optional")
    optional.required = False
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vllm.mmscope"):
        assert optional.apply() is Status.MISMATCH
    assert [r.levelno for r in caplog.records] == [logging.INFO]  # optional: not a warning


def test_arguments_and_results_pass_through_unchanged():
    h, echo = hook(), hook("echo")
    h.apply(), echo.apply()
    try:
        target = Target()
        assert target.work(2, y=5) == 7 and target.work(x=1) == 2
        assert Target.work(target, 3) == 4  # called through the class, unbound
        assert [s[:4] for s in seen] == [
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
        assert h.status is Status.APPLIED  # vLLM's error is not ours: the hook stays on
        assert Target().work(1) == 2 and len(seen) == 1
    finally:
        h.revert()


def test_an_exception_of_ours_turns_the_hook_off_once_and_puts_the_original_back(caplog):
    h = hook(wrapper=exploding, name="test.explode")
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
        assert h.status is Status.OFF
        assert h.describe() == "off: after error: RuntimeError: bug in mmscope"
        h.failed(RuntimeError("again"))  # a second thread raising late: no-op
        assert len([r for r in caplog.records if r.name == "vllm.mmscope"]) == 1
        # on record for where operators look: sent once, kept for good
        assert TURNED_OFF.all["test.explode"] == "after error: RuntimeError: bug in mmscope"
        assert TURNED_OFF.drain()["test.explode"] == TURNED_OFF.all["test.explode"]
        assert "test.explode" not in TURNED_OFF.drain()
    finally:
        h.revert()
        TURNED_OFF.all.pop("test.explode", None)


def test_a_keyboard_interrupt_inside_is_not_swallowed():
    def interrupting(hook, wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        try:
            raise KeyboardInterrupt
        except Exception as e:  # noqa: BLE001 - the plugin's guard, which must not catch it
            hook.failed(e)
        return result

    h = hook(wrapper=interrupting, name="test.interrupt")
    h.apply()
    try:
        with pytest.raises(KeyboardInterrupt):
            Target().work(1)
        assert h.status is Status.APPLIED  # not taken for a bug of ours
    finally:
        h.revert()


def test_a_hook_turned_off_can_be_applied_again():
    h = hook(wrapper=exploding, name="test.again")
    h.apply()
    Target().work(1)
    assert h.status is Status.OFF
    assert h.apply() is Status.APPLIED and Target.__dict__["work"] is not ORIGINAL_WORK
    h.revert()
    TURNED_OFF.all.pop("test.again"), TURNED_OFF.drain()


def test_a_retired_hook_puts_the_original_back_without_a_word(caplog):
    h = hook()
    h.apply()
    with caplog.at_level(logging.DEBUG, logger="vllm.mmscope"):
        h.retire("nothing to do here")
    assert Target.__dict__["work"] is ORIGINAL_WORK
    assert h.describe() == "retired: nothing to do here"
    assert not [r for r in caplog.records if r.name == "vllm.mmscope"]
    assert h.apply() is Status.APPLIED and Target().work(1) == 2 and len(seen) == 1
    h.revert()


def test_the_table_leaves_out_rows_of_other_releases_skipped_ones_and_switched_off_features(
        monkeypatch):
    rows = [hook(name="test.always"), hook("echo", name="test.old"),
            hook("cls_work", name="test.skipped"), hook("static_work", name="test.switched")]
    rows[1].releases = "<0.34"
    rows[3].feature = "switched"
    table = Table(rows, switches={"switched": "MMSCOPE_TEST_SWITCH"})
    monkeypatch.setenv("MMSCOPE_SKIP_HOOKS", "test.skipped")
    monkeypatch.setenv("MMSCOPE_TEST_SWITCH", "off")
    table.apply(When.START, "0.34.0")
    try:
        assert [r.describe() for r in rows] == [
            "applied", "not in this release: vLLM 0.34.0", "skipped: MMSCOPE_SKIP_HOOKS",
            "skipped: MMSCOPE_TEST_SWITCH=1 turns it on"]
        assert all(r.table is table for r in rows) and table.by_name["test.old"] is rows[1]
    finally:
        table.revert()
    assert [r.status for r in rows] == [Status.NOT_APPLIED] * 4


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
    # every row of this release present; vLLM 0.34's standalone CPU runner's are not in it
    assert {h["name"]: h["status"] for h in data["hooks"]} == {
        h["name"]: "not in this release" if h["releases"] == ">=0.34" else "ok"
        for h in data["hooks"]}
    from mmscope.doctor import release_check
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
    assert {h["runner"] for h in data["hooks"]
            if not h["applies"] and h["status"] != "not in this release"} == {other}
    text = doctor(VLLM_USE_V2_MODEL_RUNNER=forced, COLUMNS="200")
    label = "Model Runner " + runner.upper()
    assert f"model runner here: {label} (VLLM_USE_V2_MODEL_RUNNER={forced})" in text
    here = [h for h in data["hooks"] if h["status"] != "not in this release"]
    n, mine = len(here), sum(h["applies"] for h in here)
    assert (f"{n} of the {n} hook targets of this release present in the installed vLLM; {mine} "
            f"of the {mine} hooks that apply to {label} ok; {n - mine} are the other runner's, "
            f"not used here; {len(data['hooks']) - n} rows are for other releases") in text
    assert f"ok: all {n} hook targets of this release present" in text or "not checked" in text
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

    from mmscope.vllm.instrumentor import vllm_version
    from mmscope.vllm.patching import in_release

    version = vllm_version()
    for h in targets.TABLE:
        if in_release(h, version):
            assert h.check() == (True, ""), (h.name, h.detail)


def test_every_wrapper_takes_exactly_its_rows_params():
    """The row is the truth: each wrapper is called with (hook, wrapped, instance, args, kwargs)
    and the row's params; one argument more or less does not fit (wrappers made to serve several
    rows take the row's params as *params)."""
    import inspect

    from mmscope.vllm import targets

    for h in targets.TABLE:
        signature = inspect.signature(h.wrapper)
        fixed = 5 + len(h.params)
        signature.bind(*range(fixed))  # raises TypeError when the row's params do not fit
        variadic = any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values())
        if not variadic:
            for wrong in (fixed - 1, fixed + 1):
                with pytest.raises(TypeError):
                    signature.bind(*range(wrong))


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
    import dataclasses
    from types import SimpleNamespace as NS

    from vllm.v1.metrics.loggers import StatLoggerManager

    from mmscope.vllm import targets
    from mmscope.vllm.wire.scheduler_stats import Carried

    original = StatLoggerManager.__dict__["record"]
    hook = targets.TABLE.by_name["stat_loggers.record"]
    assert hook.apply() is Status.APPLIED
    try:
        manager = object.__new__(StatLoggerManager)
        manager.stat_loggers = [Unweakable()]
        stats = NS(**{**{f.name: None for f in dataclasses.fields(Carried)},
                      "encoder_cache_stats": {"queries": 1}})
        with caplog.at_level(logging.WARNING, logger="vllm.mmscope"):
            for _ in range(2):
                manager.record(scheduler_stats=stats, iteration_stats=None, engine_idx=0)
        assert manager.stat_loggers[0].calls == 2  # vLLM's own work, both times
        assert StatLoggerManager.__dict__["record"] is original and hook.status is Status.OFF
        warnings = [r.getMessage() for r in caplog.records
                    if r.levelno == logging.WARNING and r.name == "vllm.mmscope"]
        assert len(warnings) == 1 and warnings[0].startswith(
            "mmscope: hook stat_loggers.record raised TypeError: ")
        assert "stat_loggers.record" in TURNED_OFF.all
    finally:
        hook.revert()
        TURNED_OFF.all.pop(hook.name, None), TURNED_OFF.drain()
