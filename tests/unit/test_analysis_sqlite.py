"""The SQLite reader on every file layout SQLite writes, and reading that leaves the file as found.

Page sizes, long names on overflow chains, freelists, auto_vacuum, reserved bytes, UTF-16 and WAL
files (checkpointed, with a live writer, or a `-wal` without its `-shm`) give the exact stage
numbers of the plain file; reading writes nothing beside the input and sees commits in the WAL.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys

import pytest

from mmscope import cli, stages
from mmscope.analyze.readers import nsys
from mmscope.analyze.report.analysis import stage_stats
from tests.kit import nsys as F

LONG_NAMES = {"n1200": "a" * 1200, "n5000": "é" * 5000, "n100k": "z" * 100_000}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return stage_stats(nsys.load(F.pipeline_file(tmp_path_factory.mktemp("ref") / "p.sqlite")))


def listing(folder) -> dict:
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}


@pytest.mark.parametrize("pragmas", [
    ("page_size=512",), ("page_size=1024",), ("page_size=8192",), ("page_size=65536",),
    ("auto_vacuum=FULL",), ("auto_vacuum=INCREMENTAL",),
    ("encoding='UTF-16le'",), ("encoding='UTF-16be'",),
    ("page_size=512", "encoding='UTF-16le'", "auto_vacuum=FULL"),
], ids=lambda p: ",".join(p))
def test_page_layouts_give_the_same_stages(tmp_path, reference, pragmas):
    path = F.pipeline_file(tmp_path / "p.sqlite", pragmas=pragmas)
    assert stage_stats(nsys.load(path)) == reference


@pytest.mark.parametrize("reserve", [8, 32, 255])
def test_reserved_bytes_at_page_ends(tmp_path, reference, reserve):
    path = tmp_path / "r.sqlite"
    F.reserve_bytes(path, reserve)
    F.pipeline_file(path)
    assert open(path, "rb").read(100)[20] == reserve
    assert stage_stats(nsys.load(str(path))) == reference


@pytest.mark.parametrize("page_size", [512, 4096])
@pytest.mark.parametrize("registered", [True, False])
def test_names_on_overflow_chains(tmp_path, page_size, registered):
    path = tmp_path / "long.sqlite"
    with F.NsysFile(path, old=not registered, pragmas=(f"page_size={page_size}",)) as f:
        for j, name in enumerate(LONG_NAMES.values()):
            f.range(name, 100 * j, 100 * j + 10 + j, registered=registered)
            f.range(name, 1000 + 100 * j, 1000 + 100 * j + 20, registered=registered)
    by = {r["name"]: r for r in stage_stats(nsys.load(str(path)))}
    for j, name in enumerate(LONG_NAMES.values()):
        assert (by[name]["count"], by[name]["total_ns"], by[name]["max_ns"]) == (2, 30 + j, 20)


@pytest.mark.parametrize("vacuum", ["NONE", "INCREMENTAL"])
def test_freelist_pages(tmp_path, reference, vacuum):
    path = tmp_path / "free.sqlite"
    with F.NsysFile(path, pragmas=(f"auto_vacuum={vacuum}", "page_size=1024")) as f:
        f.con.execute("CREATE TABLE filler (blob BLOB)")
        f.con.executemany("INSERT INTO filler VALUES (?)", [(b"x" * 3000,)] * 300)
        f.con.commit()
        F.write_pipeline(f, stages)
        f.con.execute("DROP TABLE filler")
        f.con.commit()
        if vacuum == "INCREMENTAL":
            f.con.execute("PRAGMA incremental_vacuum(100)")
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA freelist_count").fetchone()[0] > 0
    con.close()
    assert stage_stats(nsys.load(str(path))) == reference


def wal_writer(path):
    """A live writer in WAL mode that never checkpoints: its commits stay in the -wal."""
    f = F.NsysFile(path, pragmas=("journal_mode=WAL", "wal_autocheckpoint=0"))
    F.write_pipeline(f, stages)
    f.con.commit()
    return f


def test_wal_checkpointed(tmp_path, reference):
    path = F.pipeline_file(tmp_path / "w.sqlite", pragmas=("journal_mode=WAL",))
    assert not os.path.exists(path + "-wal")  # the last connection checkpointed it
    before = listing(tmp_path)
    assert stage_stats(nsys.load(path)) == reference
    assert listing(tmp_path) == before


def test_wal_with_a_live_writer_is_read_in_place(tmp_path, reference):
    path = tmp_path / "live.sqlite"
    writer = wal_writer(path)
    try:
        assert os.path.getsize(str(path) + "-wal") > 0
        before = listing(tmp_path)
        assert stage_stats(nsys.load(str(path))) == reference
        assert set(listing(tmp_path)) == set(before)
        assert listing(tmp_path)[path.name] == before[path.name]
    finally:
        writer.close()


def test_a_wal_without_its_shm_is_read_without_creating_one(tmp_path, reference):
    live = tmp_path / "live"
    live.mkdir()
    writer = wal_writer(live / "w.sqlite")
    left = tmp_path / "left"
    left.mkdir()
    try:
        for name in ("w.sqlite", "w.sqlite-wal"):  # what a killed writer leaves, -shm aside
            shutil.copy2(live / name, left / name)
    finally:
        writer.close()
    before = listing(left)
    assert stage_stats(nsys.load(str(left / "w.sqlite"))) == reference
    assert listing(left) == before


def analyze_json(path) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["analyze", str(path), "--json"]) == 0
    return json.loads(out.getvalue())


def forward_count(doc) -> int:
    return {s["name"]: s for s in doc["stages"]}[stages.FORWARD]["count"]


def test_a_commit_in_the_wal_is_seen_by_the_next_analysis(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = tmp_path / "live.sqlite"
    writer = wal_writer(path)
    try:
        before = listing(tmp_path)
        assert forward_count(analyze_json(path)) == 3
        writer.range(stages.FORWARD, 9100, 9200, pid=F.WORKER_PID)
        writer.con.commit()
        assert listing(tmp_path)[path.name] == before[path.name]  # the commit is in the -wal
        assert forward_count(analyze_json(path)) == 4  # not the cached answer
        assert forward_count(analyze_json(path)) == 4  # and now cached
        assert listing(tmp_path)[path.name] == before[path.name]
    finally:
        writer.close()
