"""Exact per-stage statistics, step join and cache benefit on the scripted pipeline profile."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kit import nsys as F
from mmscope import stages
from mmscope.analyze.ranges import benefit, figures, frame, stats, steps
from mmscope.analyze.readers import nsys
from mmscope.analyze.ranges.table import build
from mmscope.analyze.report.analysis import stage_stats


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return nsys.load(F.pipeline_file(tmp_path_factory.mktemp("s") / "p.sqlite"))


@pytest.fixture
def built(table):
    return frame.build(table)


def by_name(rows):
    return {r["name"]: r for r in rows}


def test_stage_stats_exact(table):
    s = by_name(stage_stats(table))
    pre = s[stages.PREPROCESS]
    assert {k: pre[k] for k in ("count", "total_ns", "mean_ns", "p50_ns", "p90_ns", "p99_ns",
                                "min_ns", "max_ns")} == {
        "count": 3, "total_ns": 2500, "mean_ns": 833, "p50_ns": 1000, "p90_ns": 1200,
        "p99_ns": 1200, "min_ns": 300, "max_ns": 1200}
    assert pre["parent"] is None and pre["share_of_parent"] is None
    # its children: load 150, vit 1200, save 200 (holding a mark), gather 300, embed 100, and
    # the three step_meta marks, which take no time
    assert pre["self_ns"] == 2500 - 150 - 1200 - 200 - 300 - 100
    vit = s[stages.VIT_FORWARD]
    assert (vit["count"], vit["total_ns"], vit["mean_ns"], vit["p50_ns"], vit["p90_ns"],
            vit["max_ns"]) == (2, 1200, 600, 500, 700, 700)
    # over every preprocess range's time, also the one without an encoder run
    assert (vit["parent"], vit["in_parent"], vit["parent_count"]) == (stages.PREPROCESS, 2, 3)
    assert vit["share_of_parent"] == pytest.approx(1200 / 2500, abs=1e-6)
    gather = s[stages.GATHER_MM_EMBEDDINGS]
    assert (gather["count"], gather["total_ns"], gather["share_of_parent"]) == (3, 300, 0.12)
    load = s[stages.EC_LOAD]
    assert load["share_of_parent"] == pytest.approx(150 / 2500, abs=1e-6)
    assert s[stages.FORWARD]["total_ns"] == 2500
    meta = s[stages.STEP_META_STAGE]
    assert (meta["count"], meta["total_ns"]) == (3, 0)
    assert s["cache_probe"]["parent"] == stages.EC_SAVE
    assert s[stages.POSTPROCESS]["total_ns"] == 500  # unclosed: ends at the last timestamp


def test_nearest_rank_percentiles(tmp_path):
    path = tmp_path / "p.sqlite"
    with F.NsysFile(path) as f:
        for i in range(1, 11):  # durations 10, 20, ..., 100
            f.range(stages.VIT_FORWARD, 1000 * i, 1000 * i + 10 * i)
    r = stage_stats(nsys.load(str(path)))[0]
    assert (r["count"], r["total_ns"], r["mean_ns"], r["p50_ns"], r["p90_ns"], r["p99_ns"],
            r["max_ns"]) == (10, 550, 55, 50, 90, 100, 100)


def test_filter_keeps_matching_stages(table):
    names = [r["name"] for r in stage_stats(table, name_filter="^ec_connector")]
    assert sorted(names) == [stages.EC_LOAD, stages.EC_SAVE]


def test_step_join_pairs(table, built):
    pairs = steps.step_join(built)
    got = [(table.start[f], table.start[m], ns, p, d, tot, r) for f, m, ns, p, d, tot, r in zip(
        pairs["forward_row"], pairs["meta_row"], pairs["forward_ns"], pairs["prefill"],
        pairs["decode"], pairs["total"], pairs["reqs"])]
    assert got == [(2200, 1000, 1000, 8, 0, 8, 1), (4500, 4000, 500, 0, 2, 2, 2),
                   (7400, 6000, 1000, 4, 1, 5, 2)]
    summary = steps.summary(built, pairs)
    assert (summary["pairs"], summary["forwards"], summary["step_metas"],
            summary["unmatched_forwards"], summary["unjoined_step_metas"]) == (3, 3, 3, 0, 0)
    assert [(k["kind"], k["steps"], k["forward_mean_ns"]) for k in summary["by_kind"]] == [
        ("prefill", 1, 1000), ("decode", 1, 500), ("mixed", 1, 1000)]
    assert summary["fit"]["ns_per_token"] == pytest.approx(250 / 3, abs=1e-3)
    assert summary["fit"]["intercept_ns"] == pytest.approx(416.7, abs=0.05)


def test_step_join_stays_on_its_thread(tmp_path):
    path = tmp_path / "threads.sqlite"
    meta = stages.step_meta_range(stages.StepShape(1, 0, 1, 1))
    with F.NsysFile(path) as f:
        f.range(meta, 0, 0, pid=5, tid=6)           # another thread: never joins
        f.range(stages.FORWARD, 10, 20, pid=5, tid=5)
        f.range(meta, 30, 30, pid=5, tid=5)
        f.range(stages.FORWARD, 40, 60, pid=5, tid=5)
    t = nsys.load(str(path))
    built = frame.build(t)
    pairs = steps.step_join(built)
    assert [(t.start[f], t.start[m]) for f, m in zip(pairs["forward_row"], pairs["meta_row"])] \
        == [(40, 30)]
    s = steps.summary(built, pairs)
    assert (s["unmatched_forwards"], s["unjoined_step_metas"]) == (1, 1)


def test_cache_benefit_numbers(built):
    """Three steps of the pipeline: prefill with the encoder, decode without, mixed with."""
    step_table = steps.steps_of(built, steps.step_join(built))
    assert list(built.table.start[step_table["pre"]]) == [1100, 4100, 6100]
    assert list(step_table["encoder_ns"]) == [500, 0, 700]
    b = benefit.cache_benefit(built, step_table)
    assert b["available"] and (b["preprocess_ranges"], b["steps"]) == (3, 3)
    by = {r["kind"]: r for r in b["by_kind"]}
    assert by["prefill"]["with_encoder"]["steps"] == 1 and by["mixed"]["with_encoder"]["steps"] == 1
    assert by["decode"]["without_encoder"] == {"steps": 1, "total_ns": 300, "mean_ns": 300,
                                               "p50_ns": 300, "max_ns": 300}
    # no kind has steps on both sides: no like-for-like figure, and it says why
    assert b["compared_kind"] is None and b["preprocess_saved_ns"] is None
    assert "both with and without" in b["comparison_reason"]
    e = b["encoder"]
    assert (e["steps"], e["total_ns"], e["mean_ns"], e["p50_ns"], e["max_ns"]) == (
        2, 1200, 600, 500, 700)
    assert b["encoder_step_fraction"] == pytest.approx(2 / 3, abs=1e-6)
    assert b["encoder_share_of_preprocess"] == pytest.approx(1200 / 2200, abs=1e-6)


@pytest.mark.parametrize("longest", [[], [3 * 10**9]], ids=["32-bit", "over-32-bit"])
@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 10**9), min_size=1, max_size=60))
def test_percentiles_are_nearest_rank(longest, durations):
    """DuckDB's quantile_disc is the nearest rank: the ceil(p n / 100)-th smallest (durations
    ranked in 32 bits, and with a range over 2^31 ns in 64)."""
    durations = durations + longest
    start = [4 * 10**9 * i for i in range(len(durations))]
    table = build(raw_names=["x"], name_id=[0] * len(durations), start=start,
                  end=[s + d for s, d in zip(start, durations)], kind=[0] * len(durations),
                  thread=[1] * len(durations))
    (row,) = stage_stats(table)
    ordered = sorted(durations)
    for p in figures.PERCENTILES:
        assert row[f"p{p}_ns"] == ordered[max(math.ceil(p * len(ordered) / 100), 1) - 1]
