"""Hook mechanics: checked before patching, applied once, reverted, and never able to break the
patched code (our exceptions turn the hook off; the target's own pass through)."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from types import SimpleNamespace as NS

import pytest

from mmscope.vllm import patching
from mmscope.vllm.patching import (APPLIED, MISMATCH, MISSING, RESULT, Hook, all_clear, any_set,
                                   every, falsy, observe_after, observe_around, observe_before,
                                   param, truthy)


@pytest.fixture(autouse=True)
def wrappers(wrapper_road):
    """Every test runs with the C wrappers and with the Python ones: they must behave alike."""
    return wrapper_road


class Target:
    def work(self, x, y=1):
        if x < 0:
            raise ValueError("target's own error")
        return x + y

    @classmethod
    def cls_work(cls, x):
        return x * 2

    @staticmethod
    def static_work(x):
        return x * 3


seen: list = []


def record(result, *args, **kwargs):
    seen.append((result, args[1:]))


def explode(result, *args, **kwargs):
    raise RuntimeError("bug in mmscope")


def hook(attr, observe, params=("self", "x")):
    return Hook(f"test.{attr}", f"{__name__}:Target.{attr}", params, observe_after(observe),
                "test", "test")


def test_apply_observe_revert():
    seen.clear()
    h = hook("work", record)
    assert h.apply() == APPLIED
    assert Target().work(2) == 3 and seen == [(3, (2,))]
    assert h.apply() == APPLIED  # idempotent: still one wrapper
    Target().work(1)
    assert len(seen) == 2
    h.revert()
    Target().work(1)
    assert len(seen) == 2 and Target.work.__name__ == "work" and not hasattr(Target.work, "__mmscope_hook__")


def test_classmethod_and_staticmethod_keep_their_kind():
    seen.clear()
    hc = hook("cls_work", record, ("cls", "x"))
    hs = Hook("test.static", f"{__name__}:Target.static_work", ("x",), observe_after(
        lambda result, x: seen.append(result)), "test", "test")
    hc.apply(), hs.apply()
    try:
        assert Target.cls_work(2) == 4 and Target().cls_work(3) == 6
        assert Target.static_work(2) == 6 and Target().static_work(1) == 3
    finally:
        hc.revert(), hs.revert()
    assert isinstance(Target.__dict__["cls_work"], classmethod)
    assert isinstance(Target.__dict__["static_work"], staticmethod)


def test_exception_in_hook_turns_it_off_once(caplog):
    h = hook("work", explode)
    h.apply()
    try:
        with caplog.at_level(logging.WARNING, logger="vllm.mmscope"):
            assert Target().work(1) == 2  # the result is untouched
            assert Target().work(2) == 3
        warnings = [r for r in caplog.records if "test.work" in r.getMessage()]
        assert len(warnings) == 1 and "RuntimeError: bug in mmscope" in warnings[0].getMessage()
        assert h.describe().startswith("off after error")
    finally:
        h.revert()


def test_targets_own_exception_passes_through():
    calls = []
    h = Hook("test.around", f"{__name__}:Target.work", ("self", "x"),
             observe_around(lambda *a: calls.append("before") or "token",
                            lambda tok, res, *a: calls.append(("after", res))), "test", "test")
    h.apply()
    try:
        with pytest.raises(ValueError, match="target's own error"):
            Target().work(-1)
        assert calls == ["before", ("after", None)]  # per-call state still reset
        assert h.state.enabled
    finally:
        h.revert()


def test_missing_target_and_signature_mismatch_are_reported(caplog):
    missing = Hook("test.missing", f"{__name__}:Target.gone", ("self",), observe_after(record),
                   "test", "test")
    with caplog.at_level(logging.WARNING, logger="vllm.mmscope"):
        assert missing.apply() == MISSING
    assert "cannot hook test.missing" in caplog.text
    wrong = hook("work", record, ("self", "request"))
    assert wrong.apply() == MISMATCH
    assert wrong.detail == "expected (self, request, ...), found (self, x, y)"
    assert Target.work.__name__ == "work" and not hasattr(Target.work, "__mmscope_hook__")


def test_arguments_pass_through_unchanged_and_the_observer_sees_them():
    calls = []
    before = Hook("test.before", f"{__name__}:Target.work", ("self", "x"),
                  observe_before(lambda *a, **k: calls.append(("before", a[1:], k))), "test", "test")
    before.apply()
    try:
        assert Target().work(2, y=5) == 7 and Target().work(x=1) == 2 and Target.work(Target(), 3) == 4
        assert calls == [("before", (2,), {"y": 5}), ("before", (), {"x": 1}), ("before", (3,), {})]
        bound = Target().work
        assert bound.__self__.__class__ is Target and bound(4) == 5  # binds like a function
        assert Target.work.__name__ == "work" and Target.work.__wrapped__ is before._original
    finally:
        before.revert()


def test_an_interrupt_inside_an_observer_is_not_swallowed():
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt
    h = hook("work", interrupt)
    h.apply()
    try:
        with pytest.raises(KeyboardInterrupt):
            Target().work(1)
        assert h.state.enabled
    finally:
        h.revert()


class Owner:
    def step(self, stats, flag=None):
        return NS(work=stats.work, evicted=[])


def guarded_step(name: str, when: tuple) -> tuple[Hook, list]:
    """Owner.step hooked, applied, with an observer (behind `when`) that lists each tag it sees."""
    calls = []
    h = Hook(name, f"{__name__}:Owner.step", ("self", "stats"),
             observe_after(lambda result, owner, stats, *a, **k: calls.append(stats.tag), when),
             "test", "test")
    h.apply()
    return h, calls


def test_the_when_guard_calls_the_observer_only_when_a_clause_holds(wrapper_road):
    h, calls = guarded_step("test.guard", (any_set(RESULT, "work", "evicted"), any_set(1, "news"),
                                           all_clear(0, "running", "waiting")))
    try:
        busy = Owner()
        busy.running, busy.waiting = [1], []
        busy.step(NS(tag="quiet", work=0))  # no clause holds: no observer call
        busy.step(NS(tag="work", work=3))  # the result's attribute
        busy.step(NS(tag="news", work=0, news=True))  # an argument's attribute
        busy.step(NS(tag="missing", work=0, news=None))  # missing or None: false
        idle = Owner()
        idle.running, idle.waiting = [], ()
        idle.step(NS(tag="dry", work=0))  # every listed attribute empty
        Owner.step(busy, stats=NS(tag="keyword", work=0))  # fewer positionals: observer decides
        assert calls == ["work", "news", "dry", "keyword"]
    finally:
        h.revert()


def test_a_clause_with_a_parameter_name_reads_it_passed_by_keyword(wrapper_road):
    # vLLM calls StatLoggerManager.record with keyword arguments only.
    h, calls = guarded_step("test.guard_kw", (any_set(param(1, "stats"), "news"),
                                              any_set(param(2, "flag"), "up")))
    try:
        owner = Owner()
        owner.step(stats=NS(tag="quiet", work=0))  # flag omitted: None, whose `up` is missing
        owner.step(stats=NS(tag="news", work=0, news=True))
        owner.step(NS(tag="positional", work=0, news=True))
        owner.step(flag=NS(up=True), stats=NS(tag="flag", work=0))  # any keyword order
        owner.step(stats=NS(tag="flag down", work=0), flag=NS(up=False))
        Owner.step(owner, NS(tag="unbound", work=0, news=1))
        Owner.step(flag=None, self=owner, stats=NS(tag="all by keyword", work=0))
        assert calls == ["news", "positional", "flag", "unbound"]
    finally:
        h.revert()


def test_a_clause_reads_the_attributes_of_an_attribute_with_via(wrapper_road):
    h, calls = guarded_step("test.guard_via", (any_set(0, "pending", via="ledger"),
                                               all_clear(1, "queued", via="queue")))
    try:
        owner = Owner()
        owner.ledger = NS(pending={})
        busy = NS(work=0, queue=NS(queued=[1]))
        owner.step(NS(**vars(busy), tag="quiet"))  # ledger.pending empty, queue.queued not
        owner.ledger.pending["r"] = 1
        owner.step(NS(**vars(busy), tag="pending"))  # the same dict, now truthy: read in place
        owner.ledger.pending.clear()
        owner.step(NS(**vars(busy), tag="quiet again"))
        owner.step(NS(work=0, queue=NS(queued=[]), tag="drained"))  # via's attributes all clear
        owner.step(NS(work=0, tag="no queue"))  # via missing: each of its attributes is clear
        del owner.ledger
        owner.step(NS(**vars(busy), tag="no ledger"))  # any_set over a missing via: false
        assert calls == ["pending", "drained", "no queue"]
    finally:
        h.revert()


class Answer:
    """A yes/no call, like the encoder cache manager's check_and_update_cache and can_allocate."""

    def ask(self, answer, tag):
        return answer


class Undecidable:
    def __bool__(self):
        raise ValueError("no truth")


def test_a_clause_without_attributes_reads_the_truth_of_its_source(wrapper_road):
    calls = {"yes": [], "no": []}
    hooks = [Hook(f"test.{name}", f"{__name__}:Answer.ask", ("self", "answer"),
                  observe_after(lambda result, owner, answer, tag, name=name:
                                calls[name].append(tag), when), "test", "test")
             for name, when in (("yes", (truthy(RESULT),)), ("no", (falsy(1),)))]
    for h in hooks:
        h.apply()
    try:
        for answer, tag in ((True, "true"), (0, "zero"), ([1], "list"), ([], "empty"),
                            (None, "none"), (Undecidable(), "undecidable")):
            assert Answer().ask(answer, tag) is answer  # the result passes through untouched
        # Both guards wrap the same call; an undecidable truth lets the observer decide.
        assert calls == {"yes": ["true", "list", "undecidable"],
                         "no": ["zero", "empty", "none", "undecidable"]}
    finally:
        for h in reversed(hooks):
            h.revert()


def test_a_timer_clause_holds_once_per_period():
    calls = []
    h = Hook("test.timer", f"{__name__}:Target.work", ("self", "x"),
             observe_before(lambda *a, **k: calls.append(a[1]), when=(every(3600),)), "test", "test")
    h.apply()
    try:
        for x in range(3):
            Target().work(x)
        assert calls == [0]  # the first call holds, the next ones fall within the hour
    finally:
        h.revert()


@pytest.mark.vllm
def test_doctor_reports_every_hook_ok_against_installed_vllm():
    out = subprocess.run([sys.executable, "-m", "mmscope.cli", "doctor", "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads(out.stdout)
    assert data["vllm_version"].startswith("0.32") and data["entry_point"]
    assert {h["status"] for h in data["hooks"]} == {"ok"}
    assert {"scheduler.commit", "prometheus.create", "log_line.format"} <= {
        h["name"] for h in data["hooks"]}
