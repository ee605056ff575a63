"""The cache of vLLM release wheels that `mmscope doctor` and the release tests read: a wheel cut
short (a download that did not finish, another process still writing) is said in one line,
never read; a fetch writes into a folder of its own and renames the whole wheel into place."""
from __future__ import annotations

import zipfile

from mmscope.doctor import release_check as rc

WHEEL = "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"


def test_a_wheel_cut_short_is_not_whole(tmp_path):
    whole = tmp_path / "whole.whl"
    with zipfile.ZipFile(whole, "w") as z:
        z.writestr("vllm/__init__.py", "x = 1\n" * 1000)
    data = whole.read_bytes()
    cut = tmp_path / "cut.whl"
    cut.write_bytes(data[: len(data) // 2])
    assert rc.whole(whole) and not rc.whole(cut)


def test_doctor_says_a_broken_cached_wheel_in_one_row(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    rc.wheel_cache().mkdir(parents=True)
    (rc.wheel_cache() / WHEEL).write_bytes(b"PK\x03\x04 half of a wheel")
    (row,) = [r for r in rc.releases_report() if r["version"] == "0.33.0"]
    assert row["status"] == "not checked"
    assert f"the cached {WHEEL} is not a whole wheel" in row["detail"]
    assert "pip download vllm==0.33.0" in row["detail"]


def test_a_fetch_in_progress_is_never_the_cached_wheel(tmp_path, monkeypatch):
    """pip writes into .fetch-* folders beside the cache's wheels: the glob sees none of it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    partial = rc.wheel_cache() / ".fetch-123" / WHEEL
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"PK\x03\x04 being written")
    assert rc.cached_wheel("0.33.0") is None
