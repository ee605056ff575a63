"""Every figure the report prints, against values computed by hand on a constructed profile.

Four steps on one worker thread with chosen shapes and durations: the step join's per-kind
means and p50s, the fit's slope, intercept and r², the cache benefit; and what is missing is
said to be missing, never printed as a zero.
"""
from __future__ import annotations

import io

import pytest
from rich.console import Console

from mmscope import stages
from mmscope.analyze import load
from mmscope.analyze.report import analyze, print_terminal
from tests.kit import nsys as F

W = F.WORKER_PID
# (prefill, decode, reqs), forward ns, preprocess ns, vit_forward ns inside it (0: none)
STEPS = (((8, 0, 1), 1000, 500, 300), ((0, 2, 2), 400, 200, 0),
         ((4, 0, 1), 700, 600, 350), ((0, 1, 1), 300, 100, 0))


def write_steps(path, steps=STEPS, vit=True, metas=True) -> str:
    with F.NsysFile(path) as f:
        for k, ((prefill, decode, reqs), fwd, pre, enc) in enumerate(steps):
            base = 10_000 * k
            if metas:
                shape = stages.StepShape(prefill, decode, prefill + decode, reqs)
                f.range(stages.step_meta_range(shape), base, base, pid=W)
            f.range(stages.PREPROCESS, base + 100, base + 100 + pre, pid=W)
            if enc and vit:
                f.range(stages.VIT_FORWARD, base + 150, base + 150 + enc, pid=W)
            f.range(stages.FORWARD, base + 2000, base + 2000 + fwd, pid=W)
    return str(path)


def report_of(path):
    analysis = analyze(path, load(path))
    out = io.StringIO()
    print_terminal(analysis, Console(file=out, width=200))
    return analysis, out.getvalue()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return report_of(write_steps(tmp_path_factory.mktemp("r") / "steps.sqlite"))


def test_step_kinds_by_hand(built):
    analysis, text = built
    by = {k["kind"]: k for k in analysis.steps["by_kind"]}
    # prefill steps: forwards 1000 and 700 at 8 and 4 tokens; nearest rank p50 of 2 = the 1st.
    assert by["prefill"] == {"kind": "prefill", "steps": 2, "forward_mean_ns": 850,
                             "forward_p50_ns": 700, "tokens_mean": 6.0}
    # decode steps: forwards 400 and 300 at 2 and 1 tokens.
    assert by["decode"] == {"kind": "decode", "steps": 2, "forward_mean_ns": 350,
                            "forward_p50_ns": 300, "tokens_mean": 1.5}
    assert "prefill: 2 steps, forward mean 850 ns, p50 700 ns, 6 tokens on average" in text
    assert "decode: 2 steps, forward mean 350 ns, p50 300 ns, 1.5 tokens on average" in text
    assert "steps: 4 forwards joined to a step_meta (4 forwards, 4 step_meta)" in text


def test_fit_by_hand(built):
    analysis, text = built
    # x = 8, 2, 4, 1 tokens; y = 1000, 400, 700, 300 ns; mean x 3.75, mean y 600;
    # Sxx = 28.75, Sxy = 2900, Syy = 300000: slope = 2900 / 28.75 = 100.8696,
    # intercept = 600 - slope * 3.75 = 221.739, r² = Sxy² / (Sxx Syy) = 0.975072.
    assert analysis.steps["fit"] == {"ns_per_token": 100.87, "intercept_ns": 221.7,
                                     "r2": 0.9751}
    assert "forward ≈ 222 ns + 101 ns per token (r² 0.9751)" in text


def test_cache_benefit_by_hand(built):
    analysis, text = built
    b = analysis.cache_benefit
    # With the encoder: preprocess 500 and 600 (encoder 300 and 350); without: 200 and 100.
    assert b["with_encoder"] == {"steps": 2, "total_ns": 1100, "mean_ns": 550, "p50_ns": 500,
                                 "max_ns": 600}
    assert b["without_encoder"] == {"steps": 2, "total_ns": 300, "mean_ns": 150,
                                    "p50_ns": 100, "max_ns": 200}
    assert b["encoder_per_step"] == {"steps": 2, "total_ns": 650, "mean_ns": 325,
                                     "p50_ns": 300, "max_ns": 350}
    assert b["preprocess_saved_per_hit_step_ns"] == 400
    assert b["encoder_share_of_preprocess"] == round(650 / 1100, 6)
    assert b["encoder_step_fraction"] == 0.5
    assert "cache benefit: 4 preprocess steps, 50.0% ran the encoder" in text
    assert ("preprocess with encoder: mean 550 ns (2 steps); without: mean 150 ns (2 steps)"
            in text)
    assert ("encoder per step that ran it: mean 325 ns, p50 300 ns; a step without encoder "
            "work saves 400 ns") in text


def test_stage_rows_by_hand(built):
    analysis, text = built
    by = {r["name"]: r for r in analysis.stages}
    fwd = by[stages.FORWARD]
    assert (fwd["count"], fwd["total_ns"], fwd["mean_ns"], fwd["p50_ns"], fwd["p90_ns"],
            fwd["max_ns"]) == (4, 2400, 600, 400, 1000, 1000)
    vit = by[stages.VIT_FORWARD]
    assert (vit["parent"], vit["share_of_parent"]) == (stages.PREPROCESS, round(650 / 1100, 6))
    assert f"{100 * 650 / 1100:.1f}%" in text


def test_no_encoder_ranges_is_not_a_measured_zero(tmp_path):
    analysis, text = report_of(write_steps(tmp_path / "novit.sqlite", vit=False))
    b = analysis.cache_benefit
    assert b["available"] is False and f"no '{stages.VIT_FORWARD}'" in b["reason"]
    assert "0.0%" not in text
    assert (f"cache benefit: the profile has no '{stages.VIT_FORWARD}' (encoder) ranges, so "
            "which of its 4 preprocess steps ran the encoder is unknown") in text


def test_no_step_meta_says_the_shapes_are_unknown(tmp_path):
    analysis, text = report_of(write_steps(tmp_path / "nometa.sqlite", metas=False))
    s = analysis.steps
    assert s["available"] is False and s["fit"] is None
    assert "steps: the profile has no step_meta ranges (4 forwards)" in text
    assert "0 forwards joined" not in text


def test_one_batch_size_gives_no_fit_and_says_why(tmp_path):
    same = tuple(((8, 0, 1), fwd, pre, enc) for _, fwd, pre, enc in STEPS)
    analysis, text = report_of(write_steps(tmp_path / "one.sqlite", steps=same))
    assert analysis.steps["fit"] is None
    assert "no fit of forward time against tokens: every joined step has 8 tokens" in text


def test_profile_header_by_hand(built):
    analysis, text = built
    info = analysis.profile
    # 4 step_meta, 4 preprocess, 2 vit_forward, 4 forward on one thread; from 0 to the last
    # forward's end at 30000 + 2000 + 300 ns.
    assert (info["ranges"], info["threads"], info["processes"], info["span_ns"],
            info["unclosed"], info["marks"]) == (14, 1, 1, 32_300, 0, 0)
    assert "14 ranges, 1 threads, 1 processes, span 32.3 µs" in text
