"""The nsys SQLite loader on real files written through the reference DDL (both schema eras)."""
from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from tests.kit import nsys as F
from mmscope import stages
from mmscope.analyze.readers import nsys
from mmscope.errors import UserError


def row(table, name: str, start: int) -> int:
    hits = [i for i in np.flatnonzero(table.start == start) if table.name_of(i) == name]
    assert len(hits) == 1, (name, start, hits)
    return int(hits[0])


@pytest.fixture(scope="module")
def new_table(tmp_path_factory):
    return nsys.load(F.pipeline_file(tmp_path_factory.mktemp("n") / "new.sqlite"))


def test_metadata_rows_leave_and_ranges_stay(new_table):
    t = new_table
    assert len(t) == 27  # 30 rows less the two domain creates and the thread-name event
    assert t.source == "nsys-sqlite"
    assert stages.VIT_FORWARD in t.names and "vit_forward" not in t.names  # alias merged
    assert len(t.rows_named(stages.VIT_FORWARD)) == 2


def test_marks_unclosed_and_cross_thread(new_table):
    t = new_table
    mark = row(t, "cache_probe", 1750)
    assert t.kind[mark] == 2 and t.end[mark] == 1750 and not t.unclosed[mark]
    post = row(t, stages.POSTPROCESS, 8500)
    assert t.unclosed[post] and t.end[post] == F.LAST_T
    assert int(t.unclosed.sum()) == 1
    se = row(t, "ec transfer", 2500)
    assert t.kind[se] == 1
    assert t.thread[se] == F.global_tid(F.WORKER_PID, F.SE_TID)
    assert t.end_thread[se] == F.global_tid(F.WORKER_PID, F.SE_END_TID)
    assert int((t.end_thread != t.thread).sum()) == 1


def test_processes_threads_and_per_process_domains(new_table):
    t = new_table
    assert t.process_names == {F.API_PID: "api_server", F.WORKER_PID: "EngineCore"}
    assert t.thread_names == {F.global_tid(F.API_PID, F.API_PID): "api",
                              F.global_tid(F.WORKER_PID, F.WORKER_PID): "worker-0"}
    api = row(t, "api domain range", 2000)
    worker = row(t, "worker domain range", 1150)
    assert t.domains[t.domain_id[api]] == "mmscope-api"
    assert t.domains[t.domain_id[worker]] == "mmscope-worker"
    assert t.process[api] == F.API_PID and t.process[worker] == F.WORKER_PID
    assert t.domains[t.domain_id[row(t, stages.PREPROCESS, 1100)]] == ""


def test_nesting_depth_and_parent(new_table):
    t = new_table
    pre = row(t, stages.PREPROCESS, 1100)
    save = row(t, stages.EC_SAVE, 1700)
    assert (t.depth[pre], t.parent[pre]) == (0, -1)
    for name, start in ((stages.EC_LOAD, 1150), (stages.VIT_FORWARD, 1200), (stages.EC_SAVE, 1700),
                        (stages.GATHER_MM_EMBEDDINGS, 1800), (stages.EMBED_INPUT_IDS, 1900)):
        r = row(t, name, start)
        assert (t.depth[r], t.parent[r]) == (1, pre), name
    probe = row(t, "cache_probe", 1750)
    assert (t.depth[probe], t.parent[probe]) == (2, save)
    # Another domain keeps its own stack: inside preprocess in time, yet a root.
    other = row(t, "worker domain range", 1150)
    assert (t.depth[other], t.parent[other]) == (0, -1)
    hf = row(t, stages.processor_range("apply_hf_processor"), 0)
    assert t.parent[row(t, stages.hash_range("pil_image"), 100)] == hf
    assert t.parent[row(t, "request_arrived", 500)] == hf
    assert t.depth[row(t, stages.FORWARD, 2200)] == 0


def test_old_schema_loads_to_the_same_table(tmp_path, new_table):
    old = nsys.load(F.pipeline_file(tmp_path / "old.sqlite", old=True))
    cols = {r[1] for r in sqlite3.connect(tmp_path / "old.sqlite").execute(
        "PRAGMA table_info(NVTX_EVENTS)")}
    assert "eventId" not in cols and "binaryData" not in cols
    assert old.data_frame().equals(new_table.data_frame())


def test_any_number_of_reader_threads_gives_the_same_table(tmp_path, new_table):
    path = F.pipeline_file(tmp_path / "p.sqlite")
    par = nsys.load(path, workers=2)
    assert par.data_frame().equals(new_table.data_frame())
    old = nsys.load(F.pipeline_file(tmp_path / "o.sqlite", old=True), workers=3)
    assert old.data_frame().equals(new_table.data_frame())


def test_texts_with_separators_and_unpackable_ids(tmp_path):
    """Texts with separators, quotes and line breaks, huge domain ids and rowid gaps."""
    path = tmp_path / "odd.sqlite"
    with F.NsysFile(path, old=True) as f:
        f.range("a,b \"quoted\"\nline", 0, 10, registered=False)
        f.range("has\x1fseparator", 1, 5, registered=False)
        f.range("huge domain", 20, 30, domain=1 << 20)
        f.range("gone", 40, 50, registered=False)
        f.range("after gap", 60, 70, registered=False)
        f.con.execute("DELETE FROM NVTX_EVENTS WHERE text = 'gone'")
    t = nsys.load(str(path), workers=1)
    assert [t.name_of(i) for i in range(len(t))] == [
        "a,b \"quoted\"\nline", "has\x1fseparator", "huge domain", "after gap"]
    assert t.domains[t.domain_id[2]] == f"domain {1 << 20}"
    assert list(t.parent) == [-1, 0, -1, -1]


def test_empty_nvtx_table(tmp_path):
    path = tmp_path / "empty.sqlite"
    F.NsysFile(path).close()
    t = nsys.load(str(path))
    assert len(t) == 0


def test_sqlite_without_nvtx_table(tmp_path):
    path = tmp_path / "nonvtx.sqlite"
    F.NsysFile(path, nvtx=False).close()
    with pytest.raises(UserError, match="NVTX_EVENTS"):
        nsys.load(str(path))


def test_the_session_start_names_the_clock(tmp_path):
    path = tmp_path / "clock.sqlite"
    with F.NsysFile(path) as f:
        f.range("a", 0, 10)
        f.con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME (utcEpochNs, utcTime, "
                      "localTime) VALUES (1700000000123456789, 'x', 'y')")
    assert nsys.load(str(path)).clock == ("nsys session, started at UTC epoch "
                                          "1700000000123456789 ns")
    assert "not recorded" in nsys.load(F.pipeline_file(tmp_path / "p.sqlite")).clock


def test_unknown_event_types_leave_and_texts_follow_their_rows(tmp_path):
    path = tmp_path / "odd-types.sqlite"
    with F.NsysFile(path, old=True) as f:
        f.range("kept", 0, 10, registered=False)
        f.event(40000, "no nvtx type", 1, 2, 100, 100, registered=False)
        f.event(59, None, 3, 4, 100, 100, registered=False)
        f.range("also kept", 20, 30, registered=False)
    t = nsys.load(str(path))
    assert [t.name_of(i) for i in range(len(t))] == ["kept", "", "also kept"]
    assert t.start.tolist() == [0, 3, 20]
