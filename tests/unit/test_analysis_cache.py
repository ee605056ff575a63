"""The analysis cache: a second `mmscope analyze` answers from it, while the file is unchanged.

Every test has its own XDG_CACHE_HOME; "answered from the cache" means the analysis did not run.
"""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest

from tests.kit import nsys as F
from mmscope import cli, stages
from mmscope.analyze.commands import cache, analyze as command


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    home = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home


@pytest.fixture
def profile(tmp_path):
    return F.pipeline_file(tmp_path / "p.sqlite")


@pytest.fixture
def computed(monkeypatch):
    """How many times the analysis really ran (not answered from the cache)."""
    runs = []
    real = command.compute

    def counting(*args):
        runs.append(args)
        return real(*args)

    monkeypatch.setattr(command, "compute", counting)
    return runs


def analyze(capsys, *args) -> str:
    assert cli.main(["analyze", *args]) == 0
    return capsys.readouterr().out


def entries(home) -> list:
    d = home / "mmscope" / "analyze"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def test_second_run_answers_from_the_cache(profile, capsys, computed, cache_home):
    first = analyze(capsys, profile, "--json")
    assert len(computed) == 1 and len(entries(cache_home)) == 1
    second = analyze(capsys, profile, "--json")
    assert len(computed) == 1  # nothing recomputed
    assert second == first
    assert json.loads(second)["profile"]["path"] == profile


@pytest.mark.parametrize("out", ["table", "csv", "html"])
def test_every_output_format_reads_the_same_cached_analysis(profile, tmp_path, capsys, computed,
                                                             out):
    def render(*extra):
        if out == "table":
            return analyze(capsys, profile, *extra)
        target = tmp_path / f"out.{out}"
        analyze(capsys, profile, f"--{out}", str(target), *extra)
        return target.read_text()

    fresh = render("--no-cache")
    analyze(capsys, profile, "--json")  # fills the cache
    assert len(computed) == 2
    assert render() == fresh
    assert len(computed) == 2


def test_a_changed_file_is_analyzed_again(profile, capsys, computed):
    before = json.loads(analyze(capsys, profile, "--json"))
    # One more range: the file keeps its size (the row fits its page), the header changes.
    size = os.path.getsize(profile)
    con = sqlite3.connect(profile)
    con.execute("INSERT INTO StringIds (id, value) VALUES (1000, 'extra')")
    con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, textId) "
                "VALUES (100, 200, 59, ?, 1000)", (F.global_tid(300, 300),))
    con.commit()
    con.close()
    assert os.path.getsize(profile) == size
    after = json.loads(analyze(capsys, profile, "--json"))
    assert len(computed) == 2
    assert after["profile"]["ranges"] == before["profile"]["ranges"] + 1


def test_touching_the_file_invalidates_its_entry(profile, capsys, computed):
    analyze(capsys, profile, "--json")
    st = os.stat(profile)
    os.utime(profile, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    analyze(capsys, profile, "--json")
    assert len(computed) == 2


def test_no_cache_neither_reads_nor_writes(profile, capsys, computed, cache_home):
    analyze(capsys, profile, "--json", "--no-cache")
    assert entries(cache_home) == []
    analyze(capsys, profile, "--json")
    analyze(capsys, profile, "--json", "--no-cache")
    assert len(computed) == 3


def test_the_filter_is_part_of_the_key(profile, capsys, computed):
    all_stages = json.loads(analyze(capsys, profile, "--json"))["stages"]
    vit = json.loads(analyze(capsys, profile, "--json", "--filter", "vit"))["stages"]
    assert len(computed) == 2
    assert [s["name"] for s in vit] == [stages.VIT_FORWARD] and len(all_stages) > 1
    assert json.loads(analyze(capsys, profile, "--json"))["stages"] == all_stages
    assert len(computed) == 2


@pytest.mark.parametrize("garbage", [b"", b"{not json", b"\xff\xfe", b'{"key": 1}', b"[]",
                                     None])
def test_a_corrupt_entry_is_ignored_and_replaced(profile, capsys, computed, cache_home, garbage):
    first = analyze(capsys, profile, "--json")
    (entry,) = (cache_home / "mmscope" / "analyze").iterdir()
    if garbage is None:  # right key, analysis missing a part
        doc = json.loads(entry.read_text())
        del doc["analysis"]["per_step"]
        garbage = json.dumps(doc).encode()
    entry.write_bytes(garbage)
    assert analyze(capsys, profile, "--json") == first
    assert len(computed) == 2
    assert analyze(capsys, profile, "--json") == first  # the entry was written again
    assert len(computed) == 2


def test_an_unwritable_cache_is_skipped(profile, capsys, computed, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    assert analyze(capsys, profile, "--json") == analyze(capsys, profile, "--json")
    assert len(computed) == 2


def test_relative_xdg_cache_home_is_ignored(monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")
    assert cache.directory() == os.path.join(os.path.expanduser("~"), ".cache", "mmscope",
                                             "analyze")


def test_warm_run_imports_neither_numpy_nor_polars(profile, capsys):
    analyze(capsys, profile, "--json")
    code = ("import sys, io, contextlib\nfrom mmscope import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert cli.main(['analyze', {profile!r}, '--json']) == 0\n"
            "print(sorted(m for m in ('numpy', 'polars') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=os.environ.copy(), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_compare_reads_stage_tables_from_the_cache(profile, tmp_path, capsys, monkeypatch):
    other = F.pipeline_file(tmp_path / "q.sqlite")
    analyze(capsys, profile, "--json")
    analyze(capsys, other, "--json")
    import mmscope.analyze

    def no_load(*args, **kwargs):
        raise AssertionError("compare loaded a profile the cache holds")

    monkeypatch.setattr(mmscope.analyze, "load", no_load)
    assert cli.main(["compare", profile, other, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["moved_most"] == [] and all(r["status"] == "both" for r in doc["stages"])
    with pytest.raises(AssertionError, match="compare loaded"):
        cli.main(["compare", profile, other, "--json", "--no-cache"])
