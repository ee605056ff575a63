"""The C kernels against the numpy road they stand in for, on real nsys-schema SQLite files.

MMSCOPE_ANALYZE_NO_C=1 forces the numpy road; both must give the same arrays and the same JSON.
"""
from __future__ import annotations

import json
import os
import random
import sqlite3
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kit import nsys as F
from mmscope import stages
from mmscope.analyze import kernels, nsys, nsys_pages, report
from mmscope.analyze.table import nest

# pip install builds the kernels on Linux (setup.py); elsewhere the build is optional and a machine
# without a compiler takes the numpy road, which the rest of the suite covers.
pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") and kernels._load() is None,
    reason="the optional C kernels were not built on this non-Linux machine")


def test_the_kernels_are_built_on_linux():
    # On Linux their absence (or a stale build of another ABI) is a build failure, not a skip.
    assert kernels._load() is not None

ARRAYS = ("name_id", "start", "end", "kind", "thread", "end_thread", "domain_id", "unclosed",
          "depth", "parent")


@pytest.fixture(autouse=True)
def c_road(monkeypatch):
    """The C road by default, even when the whole run asks for numpy."""
    monkeypatch.delenv("MMSCOPE_ANALYZE_NO_C", raising=False)


@pytest.fixture
def numpy_road(monkeypatch):
    """Runs the body's calls on the numpy road."""
    def road(fn, *args, **kwargs):
        with monkeypatch.context() as m:
            m.setenv("MMSCOPE_ANALYZE_NO_C", "1")
            assert kernels.lib() is None
            return fn(*args, **kwargs)
    return road


def same_table(a, b) -> None:
    for k in ARRAYS:
        x, y = getattr(a, k), getattr(b, k)
        assert x.dtype == y.dtype and np.array_equal(x, y), k
    assert (a.names, a.domains, a.thread_names, a.process_names) == \
        (b.names, b.domains, b.thread_names, b.process_names)


# --- random files: what the page decoder must read exactly as SQLite does ----------------------
TEXTS = ["", "a", "vit_forward", "ünïcødé ✓", "has\x1fseparator", "x" * 150, "line\nbreak"]


def random_file(path, seed: int, page_size: int, old: bool) -> None:
    rnd = random.Random(seed)
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA page_size={page_size}")
    con.executescript(F.ddl(old))
    ids = {}
    for i, t in enumerate(TEXTS[1:], 1):
        ids[t] = i
        con.execute("INSERT INTO StringIds VALUES (?, ?)", (i, t))
    rows = []
    for _ in range(rnd.randrange(0, 2500)):
        start = rnd.choice([rnd.randrange(0, 1 << 20), rnd.randrange(-(1 << 40), 1 << 40),
                            rnd.randrange(1 << 62), rnd.randrange(-128, 128)])
        end = None if rnd.random() < 0.1 else start + rnd.choice([0, 1, 300, 1 << 33])
        etype = rnd.choice([59, 59, 60, 34, 39, 75, 70, 71, 40000])
        name = rnd.choice(TEXTS)
        registered = rnd.random() < 0.5 and name in ids
        gtid = None if rnd.random() < 0.05 else F.global_tid(rnd.choice([7, 8]), rnd.choice([7, 9]))
        # (An end thread without a start thread is left out: the SQLite reader's two queries
        # disagree on it, see nsys_scan's plain_sql and side_sql.)
        egtid = None if gtid is None else rnd.choice([None, None, gtid, F.global_tid(7, 99)])
        domain = rnd.choice([None, 0, 0, 1, 2])
        rows.append((start, end, etype, None if registered else name, gtid, egtid,
                     ids[name] if registered else rnd.choice([None, None, 999]), domain))
    con.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, "
                    "endGlobalTid, textId, domainId) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    con.execute("DELETE FROM NVTX_EVENTS WHERE rowid % 7 = 3")
    con.commit()
    con.close()


def pages_of(path):
    con = nsys._connect(path)
    try:
        return nsys_pages.layout(con, nsys._nvtx_table(con, path))
    finally:
        con.close()


@pytest.mark.parametrize("seed,page_size,old", [(s, 512 << (s % 8), s % 3 == 0)
                                                for s in range(16)])
def test_page_decoder_matches_numpy_and_sqlite(tmp_path, numpy_road, monkeypatch, seed,
                                               page_size, old):
    if seed % 2:  # two threads even on small files: their text dictionaries merge
        monkeypatch.setattr(kernels, "PARALLEL_LEAVES", 2)
    path = str(tmp_path / "r.sqlite")
    random_file(path, seed, page_size, old)
    lay = pages_of(path)
    with open(path, "rb") as f:
        page_size_read, usable = nsys_pages._check_header(path, f.read(100))
        leaves = nsys_pages._leaf_pages(f, lay.root, page_size_read,
                                        os.fstat(f.fileno()).st_size // page_size_read)
        c_out = nsys_pages._read_c(f, leaves, page_size_read, usable, lay)
    try:
        np_out = numpy_road(nsys_pages.read, path, lay)
    except nsys_pages.Unsupported:
        np_out = None
    if np_out is None:
        assert c_out is None  # what numpy refuses (overflow pages here) C refuses too
    elif page_size >= 4096:
        assert c_out is not None  # ordinary files take the C road
    if c_out is not None:
        assert c_out["texts"] == np_out["texts"]
        assert c_out.pop("domains_all_zero") == (not np_out["domain"].any())
        if c_out["text_code"] is None:  # no texts at all: every code 0
            assert not np_out["text_code"].any()
            c_out["text_code"] = np_out["text_code"]
        for k in np_out:
            if k != "texts":
                assert c_out[k].dtype == np_out[k].dtype and np.array_equal(c_out[k], np_out[k]), k
    # Whatever road each takes, the tables agree, and with SQLite's.
    same_table(nsys.load(path), numpy_road(nsys.load, path))
    same_table(nsys.load(path), nsys.load(path, workers=1))


def test_a_float_where_an_integer_belongs_goes_to_sqlite(tmp_path, numpy_road):
    path = str(tmp_path / "f.sqlite")
    with F.NsysFile(path) as f:
        f.range(stages.FORWARD, 0, 10)
        f.con.execute("UPDATE NVTX_EVENTS SET end = 10.0")
    t = nsys.load(path)
    assert (t.start[0], t.end[0]) == (0, 10)
    same_table(t, numpy_road(nsys.load, path))


# --- nesting: the same depth and parent as numpy, also for ranges that do not nest -------------
INTERVALS = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1), st.integers(0, 30),
                               st.integers(0, 12), st.booleans()), max_size=60)


@settings(max_examples=300, deadline=None)
@given(INTERVALS, st.booleans())
def test_nesting_matches_numpy_on_any_intervals(rows, in_order):
    if in_order:  # as profiles list them: each thread's rows by start, longest first
        rows = sorted(rows, key=lambda r: (r[2], -r[3]))
    thread = np.array([r[0] for r in rows], np.int64)
    sub = np.array([r[1] for r in rows], np.int32)
    start = np.array([r[2] for r in rows], np.int64)
    end = start + np.array([r[3] if r[4] else 0 for r in rows], np.int64)
    saved = os.environ.pop("MMSCOPE_ANALYZE_NO_C", None)
    try:
        got = nest(thread, sub, start, end)
        os.environ["MMSCOPE_ANALYZE_NO_C"] = "1"
        want = nest(thread, sub, start, end)
    finally:
        os.environ.pop("MMSCOPE_ANALYZE_NO_C", None)
        if saved is not None:
            os.environ["MMSCOPE_ANALYZE_NO_C"] = saved
    assert got[0].tolist() == want[0].tolist()
    assert got[1].tolist() == want[1].tolist()


# --- whole analyses: byte-identical JSON on both roads ----------------------------------------
def steps_file(path, shuffle: bool, seed: int = 0) -> str:
    """Four workers running steps (step_meta, preprocess and its children, forward), with some
    overlapping siblings and a save inside vit_forward; `shuffle` scrambles the row order."""
    rnd = random.Random(seed)
    rows = []
    for pid in (300, 301, 302, 303):
        t = rnd.randrange(1000)
        for step in range(60):
            enc = rnd.random() < 0.4
            pre_len = 400 if enc else 200
            rows.append((stages.step_meta_range(stages.StepShape(step % 3, 1, step % 3 + 1, 1)),
                         t, t, pid))
            rows.append((stages.PREPROCESS, t + 10, t + 10 + pre_len, pid))
            rows.append((stages.EC_LOAD, t + 20, t + 40, pid))
            if enc:
                rows.append((stages.VIT_FORWARD, t + 50, t + 250, pid))
                save = (t + 100, t + 120) if step % 17 == 0 else (t + 260, t + 300)
                rows.append((stages.EC_SAVE, *save, pid))
            gather = t + 35 if step % 13 == 0 else t + pre_len - 50
            rows.append((stages.GATHER_MM_EMBEDDINGS, gather, gather + 30, pid))
            rows.append((stages.FORWARD, t + pre_len + 20, t + pre_len + 120 + step, pid))
            t += pre_len + 200 + rnd.randrange(50)
    if shuffle:
        rnd.shuffle(rows)
    with F.NsysFile(path) as f:
        for name, s, e, pid in rows:
            f.range(name, s, e, pid=pid)
    return str(path)


@pytest.mark.parametrize("make", ["pipeline", "steps", "steps shuffled"])
def test_analysis_json_is_the_same_on_both_roads(tmp_path, numpy_road, make):
    path = tmp_path / "p.sqlite"
    path = F.pipeline_file(path) if make == "pipeline" else steps_file(path, "shuffled" in make)

    def analysis():
        from mmscope.analyze import load

        return json.dumps(report.analyze(path, load(path)).doc(), indent=1)

    got, want = analysis(), numpy_road(analysis)
    assert got == want
    doc = json.loads(got)
    if make != "pipeline":  # the scripted faults are found on both roads
        failing = {c["name"] for c in doc["checks"] if not c["ok"]}
        assert any("disjoint" in n for n in failing) and any("never contains" in n
                                                             for n in failing)


def test_step_meta_parser_matches_the_regex():
    from mmscope.analyze import steps

    names = [stages.step_meta_range(stages.StepShape(8, 0, 8, 1)), "step_meta: prefill=007 "
             "decode=1 total=8 reqs=2", "step_meta: prefill=1 decode=2 total=3 reqs=", "forward",
             "step_meta: prefill=1 decode=2 total=3 reqs=4 ", "step_meta: prefill=1 decode=2",
             "", "step_meta: prefill=1 decode=2 total=3 reqs=4x", "step_meta:  prefill=1 "
             "decode=2 total=3 reqs=4", "step_meta: prefill=1 decode=2 total=3 reqs=4\r",
             "step_meta: prefill=123456789012345678 decode=0 total=0 reqs=0",
             "x step_meta: prefill=1 decode=2 total=3 reqs=4"]
    text = "\n".join(names)
    assert kernels.parse_step_meta(text, len(names)).tolist() == \
        steps._parse_regex(names, text).tolist()
    long = names + ["step_meta: prefill=1234567890123456789 decode=0 total=0 reqs=0"]
    assert kernels.parse_step_meta("\n".join(long), len(long)) is None
    assert steps._parse_shapes(long).tolist() == [list(steps._shape_of(n)) for n in long]


def test_stage_table_with_many_stages_matches_numpy(tmp_path, numpy_road):
    """Past 32 stages the C stage table finds distinct (stage, parent) pairs another way."""
    path = tmp_path / "many.sqlite"
    rnd = random.Random(5)
    with F.NsysFile(path) as f:
        t = 0
        for step in range(40):
            f.range(stages.PREPROCESS, t, t + 1000, pid=300 + step % 3)
            for j, k in enumerate(rnd.sample(range(45), 6)):  # 6 of 45 names, each twice
                s = t + 10 + 150 * j
                f.range(f"stage {k}", s, s + 50 + k, pid=300 + step % 3)
                f.range(f"stage {k}", s + 100, s + 110, pid=300 + step % 3)
            t += 2000

    def table():
        from mmscope.analyze import load, stats

        return stats.stage_stats(load(str(path)))

    got, want = table(), numpy_road(table)
    assert len(got) > 32 and got == want
    assert all(r["parent"] == stages.PREPROCESS for r in got if r["name"].startswith("stage "))


def test_a_library_of_another_abi_is_not_used(monkeypatch):
    monkeypatch.setattr(kernels, "_LIB", [])
    monkeypatch.setattr(kernels, "ABI", kernels.ABI + 1)
    assert kernels.lib() is None
    monkeypatch.setattr(kernels, "_LIB", [])
    monkeypatch.setattr(kernels, "ABI", kernels.ABI - 1)
    assert kernels.lib() is not None
