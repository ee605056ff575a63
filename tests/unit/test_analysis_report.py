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
from mmscope.analyze.report.analysis import analyze
from mmscope.analyze.report.terminal import print_terminal
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
                                     "r2": 0.9751, "steps": 4}
    assert "forward ≈ 222 ns + 101 ns per token (r² 0.9751, 4 steps)" in text


def test_a_benefit_without_like_steps_says_so(built):
    """Both prefill steps ran the encoder and no decode step did: nothing to compare like for
    like, and the report says so instead of putting prefill against decode."""
    analysis, text = built
    b = analysis.cache_benefit
    by = {r["kind"]: r for r in b["by_kind"]}
    assert by["prefill"]["with_encoder"] == {"steps": 2, "total_ns": 1100, "mean_ns": 550,
                                             "p50_ns": 500, "max_ns": 600,
                                             "encoder_mean_ns": 325}
    assert by["prefill"]["without_encoder"]["steps"] == 0
    assert by["decode"]["without_encoder"]["mean_ns"] == 150
    assert b["compared_kind"] is None and b["preprocess_saved_ns"] is None
    assert "like for like: no kind of step has steps both with and without encoder work" in text
    assert "saves" not in text and "less in preprocess" not in text


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
    assert (info["ranges"], info["threads"], len(info["processes"]), info["span_ns"],
            info["unclosed"], info["marks"]) == (14, 1, 1, 32_300, 0, 0)
    assert "14 ranges, 1 threads, 1 processes, span 32.3 µs" in text
    assert [p["pid"] for p in info["processes"]] == [W] and info["roles"] == ["worker"]


# --- a hand-built profile with known nesting across two processes (tests/kit/nsys.py) ---
API = F.API_PID


@pytest.fixture(scope="module")
def nested(tmp_path_factory):
    return report_of(F.nested_file(tmp_path_factory.mktemp("n") / "nested.sqlite"))


def node(analysis, role, *path):
    """The tree node at this path of stage names under a role."""
    parent = None
    for name in path:
        (found,) = [n for n in analysis.tree
                    if n["role"] == role and n["name"] == name and n["parent"] == parent]
        parent = found["id"]
    return found


def test_share_of_parent_is_over_the_parents_whole_time(nested):
    analysis, text = nested
    by = {r["name"]: r for r in analysis.stages}
    pre_total = 1000 + 600 + 200 + 150 + 100 + 80
    assert by[stages.PREPROCESS]["total_ns"] == pre_total
    vit, gather = by[stages.VIT_FORWARD], by[stages.GATHER_MM_EMBEDDINGS]
    assert (vit["total_ns"], vit["in_parent"], vit["parent_count"]) == (850, 2, 6)
    assert vit["share_of_parent"] == round(850 / pre_total, 6)
    assert gather["share_of_parent"] == round(250 / pre_total, 6)
    # the second hf_processor holds no hash: the hash is 100 of both calls' 600 ns
    h = by[stages.hash_range("pil_image")]
    assert (h["parent"], h["share_of_parent"]) == (stages.processor_range("apply_hf_processor"),
                                                   round(100 / 600, 6))
    assert node(analysis, "worker", stages.PREPROCESS, stages.VIT_FORWARD)[
        "share_of_parent"] == round(850 / pre_total, 6)
    assert f"└─ {stages.hash_range('pil_image')}" in text and "16.7%" in text


def test_self_time_is_the_time_less_the_childrens(nested):
    analysis, _ = nested
    by = {r["name"]: r for r in analysis.stages}
    assert by[stages.PREPROCESS]["self_ns"] == 2130 - 850 - 250
    assert by[stages.processor_range("apply_hf_processor")]["self_ns"] == 600 - 100
    assert by[stages.VIT_FORWARD]["self_ns"] == 850
    pre = node(analysis, "worker", stages.PREPROCESS)
    assert (pre["count"], pre["total_ns"], pre["self_ns"]) == (6, 2130, 1030)


def test_the_tree_is_per_role_and_names_processes_and_threads(nested):
    analysis, text = nested
    info = analysis.profile
    assert info["roles"] == ["API server", "worker"]
    assert [(p["pid"], p["name"], p["role"]) for p in info["processes"]] == [
        (API, "api_server", "API server"), (W, "VLLM::Worker", "worker")]
    assert info["processes"][0]["threads"] == [{"tid": API, "name": "api-main", "ranges": 3}]
    roots = [(n["role"], n["name"]) for n in analysis.tree if n["parent"] is None]
    assert roots == [("API server", stages.processor_range("apply_hf_processor")),
                     ("worker", stages.FORWARD), ("worker", stages.PREPROCESS)]
    kids = [n["name"] for n in analysis.tree
            if n["parent"] == node(analysis, "worker", stages.PREPROCESS)["id"]]
    assert kids == [stages.VIT_FORWARD, stages.GATHER_MM_EMBEDDINGS, "step_meta"]
    assert f"API server: pid {API} api_server (thread {API} api-main)" in text
    assert f"worker: pid {W} VLLM::Worker (thread {W})" in text


def test_the_benefit_compares_prefill_with_prefill(nested):
    """Prefill with encoder work (1000 and 600 ns of preprocess; the encoder 500 and 350)
    against prefill without (200 ns), never against decode steps or a preprocess no forward
    follows."""
    analysis, text = nested
    b = analysis.cache_benefit
    assert (b["preprocess_ranges"], b["steps"]) == (6, 5)
    assert b["without_forward"] == {"ranges": 1, "mean_ns": 80}
    by = {r["kind"]: r for r in b["by_kind"]}
    assert by["prefill"]["with_encoder"] == {"steps": 2, "total_ns": 1600, "mean_ns": 800,
                                             "p50_ns": 600, "max_ns": 1000,
                                             "encoder_mean_ns": 425}
    assert by["prefill"]["without_encoder"] == {"steps": 1, "total_ns": 200, "mean_ns": 200,
                                                "p50_ns": 200, "max_ns": 200}
    assert by["decode"]["without_encoder"]["steps"] == 2
    assert (b["compared_kind"], b["preprocess_saved_ns"]) == ("prefill", 600)
    assert b["encoder"] == {"steps": 2, "total_ns": 850, "mean_ns": 425, "p50_ns": 350,
                            "max_ns": 500}
    assert (b["encoder_steps"], b["encoder_step_fraction"]) == (2, 0.4)
    assert b["encoder_share_of_preprocess"] == round(850 / 1600, 6)
    assert ("prefill steps: preprocess with encoder work mean 800 ns (2 steps; the encoder "
            "425 ns of it), without mean 200 ns (1 steps): a prefill step without encoder work "
            "spends 600 ns less in preprocess") in text
    assert "1 preprocess ranges no forward follows (mean 80 ns) are no step and left out" in text


def test_the_per_step_view_holds_each_steps_parts(nested):
    analysis, _ = nested
    view = analysis.per_step
    assert (view["steps"], view["shown"]) == (5, 5)
    assert view["parts"] == ["encoder", "preprocess (rest)", stages.FORWARD, "other"]
    assert view["kind"] == ["prefill", "prefill", "prefill", "decode", "decode"]
    assert view["ns"][0] == [500, 500, 1000, 0]
    assert view["ns"][2] == [0, 200, 600, 0]
    assert view["start_ns"] == [100, 3100, 5100, 7100, 9100]


def test_flat_keeps_one_row_per_stage(nested, tmp_path):
    analysis, _ = nested
    out = io.StringIO()
    print_terminal(analysis, Console(file=out, width=220), flat=True)
    text = out.getvalue()
    assert "stages (durations per range)" in text and "├─" not in text
    assert f"{stages.PREPROCESS} (2 in 6)" in text


def test_the_terminal_tree_hides_small_nodes_but_never_a_catalogue_stage(tmp_path):
    path = tmp_path / "small.sqlite"
    with F.NsysFile(path) as f:
        f.range("long startup", 0, 1_000_000, pid=W)
        f.range("tiny helper", 2_000_000, 2_000_010, pid=W)
        f.range(stages.hash_range("pil_image"), 3_000_000, 3_000_010, pid=W)
    _, text = report_of(str(path))
    assert "long startup" in text and stages.hash_range("pil_image") in text
    assert "tiny helper" not in text
    assert "1 nodes outside the stage catalogue under 0.5% of the role's time not shown" in text
