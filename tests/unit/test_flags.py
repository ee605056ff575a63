"""Every switch is read one way: on, off, or its default with one warning for anything else."""
from __future__ import annotations

import logging

import pytest

from mmscope import flags


@pytest.mark.parametrize("raw, want", [("1", True), ("true", True), (" Yes ", True), ("ON", True),
                                       ("0", False), ("false", False), ("no", False),
                                       ("Off", False), ("", False)])
def test_on_and_off_words(monkeypatch, raw, want):
    monkeypatch.setenv("MMSCOPE_TEST_FLAG", raw)
    assert flags.flag("MMSCOPE_TEST_FLAG") is want
    assert flags.flag("MMSCOPE_TEST_FLAG", default=True) is want


def test_unset_is_the_default_and_an_unreadable_value_warns_once(monkeypatch, caplog):
    monkeypatch.delenv("MMSCOPE_TEST_FLAG", raising=False)
    assert flags.flag("MMSCOPE_TEST_FLAG") is False
    assert flags.flag("MMSCOPE_TEST_FLAG", default=True) is True
    monkeypatch.setenv("MMSCOPE_TEST_UNREADABLE", "maybe")
    with caplog.at_level(logging.WARNING, logger="vllm.mmscope"):
        assert flags.flag("MMSCOPE_TEST_UNREADABLE", default=True) is True
        assert flags.flag("MMSCOPE_TEST_UNREADABLE", default=True) is True
    assert [r.getMessage() for r in caplog.records] == [
        "mmscope: MMSCOPE_TEST_UNREADABLE='maybe' is neither on (1, true, yes, on) nor off "
        "(0, false, no, off); it stays on"]


def test_the_plugin_stays_on_when_mmscope_disable_says_false(monkeypatch):
    monkeypatch.setenv("MMSCOPE_DISABLE", "false")
    assert flags.flag("MMSCOPE_DISABLE") is False
