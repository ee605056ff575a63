"""Stage ranges and step telemetry in the offline engine, read back from the Chrome trace file
(MMSCOPE_TRACE=chrome): names, nesting under the step's ranges, counts, step_meta numbers; under
both model runners (V2 has no _prepare_mm_inputs, so no prepare stage)."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

import pytest

from mmscope import stages
from mmscope.emit import tracing
from tests.kit import runners, traces as tk
from tests.kit.engine import EncoderWork, image, offline_llm, prompt

pytestmark = [pytest.mark.vllm, pytest.mark.runners]

# The worker's stages under the test run's runner: V2 has no counterpart of V1's prepare stage.
SIBLINGS = tuple(s for s in stages.PREPROCESS_SIBLINGS
                 if runners.current() == runners.V1 or s != stages.PREPARE_MM_INPUTS)
EVERY_STEP = tuple(s for s in (stages.GATHER_MM_EMBEDDINGS, stages.EMBED_INPUT_IDS,
                               stages.PREPARE_MM_INPUTS) if s in SIBLINGS)


@pytest.fixture(scope="module")
def traced(tiny_model, tmp_path_factory):
    trace_dir = tmp_path_factory.mktemp("traces")
    tracing.configure("chrome", str(trace_dir))
    from mmscope.vllm.instrumentor import get_instrumentor
    get_instrumentor().uninstrument()  # instrument() again now that tracing is on: as at the
    get_instrumentor().instrument()  # start of a process with MMSCOPE_TRACE=chrome
    work = EncoderWork()  # before the engine: a V2 runner wraps the model's method as it loads
    llm = offline_llm(tiny_model)
    work.reset()
    lines: list[str] = []
    step_logger = logging.getLogger("vllm.mmscope")
    handler = logging.Handler()
    handler.emit = lambda r: (r.getMessage().startswith("step_tokens")
                              and lines.append((r.levelno, r.getMessage())))
    step_logger.addHandler(handler)
    step_logger.setLevel(logging.DEBUG)
    yield llm, work, trace_dir, lines
    step_logger.removeHandler(handler)
    step_logger.setLevel(logging.NOTSET)
    work.close()
    tracing.configure("off")
    get_instrumentor().uninstrument()
    get_instrumentor().instrument()


def generate(llm, prompts, max_tokens=3):
    from vllm import SamplingParams
    return llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                ignore_eos=True), use_tqdm=False)


def window(trace_dir, t0_us):
    tracing.flush()
    ranges, _ = tk.load(trace_dir)
    return [r for r in ranges if r.start >= t0_us]


def now_us():
    return time.perf_counter_ns() / 1000


def test_seed_tree_and_counts(traced):
    llm, work, trace_dir, _ = traced
    t0, items0 = now_us(), work.items
    generate(llm, [prompt([image(501), image(502)], "Two?"), prompt([image(503)], "One?")])
    generate(llm, [prompt([image(501)], "Seen before?")])  # all-cache-hit step(s)
    generate(llm, [prompt([], "Just text")])
    rs = window(trace_dir, t0)

    # Hashing: one mm:hash range per image item processed, on the pil_image branch.
    assert len(tk.named(rs, stages.hash_range("pil_image"))) == 4
    for stage in ("get_mm_hashes", "get_cache_missing_items", "apply_hf_processor",
                  "merge_mm_kwargs", "apply_prompt_updates"):
        assert len(tk.named(rs, stages.processor_range(stage))) == 3  # one per MM prompt

    # The encoder ran in exactly one step (the first batch); its range sits under preprocess.
    vit = tk.named(rs, stages.VIT_FORWARD)
    assert len(vit) == 1 and work.items - items0 == 3
    preprocess = tk.named(rs, stages.PREPROCESS)
    assert tk.parent_of(vit[0], preprocess + vit) in preprocess
    # Every catalogued child of preprocess sits directly in a preprocess range, and siblings
    # never overlap.
    children = [r for r in rs if r.name in stages.PREPROCESS_SIBLINGS]
    assert {r.name for r in children} == {stages.VIT_FORWARD, *EVERY_STEP}
    for c in children:
        assert tk.parent_of(c, preprocess + children).name == stages.PREPROCESS
    for p in preprocess:
        kids = sorted((c for c in children if tk.within(c, p)), key=lambda c: c.start)
        for a, b in zip(kids, kids[1:]):
            assert a.end <= b.start, f"{a.name} overlaps {b.name}"


def test_step_meta_once_per_step_with_exact_shape(traced):
    llm, _, trace_dir, lines = traced
    lines.clear()
    t0 = now_us()
    outs = generate(llm, [prompt([image(601)], "A?"), prompt([], "Plain text here")], max_tokens=4)
    rs = window(trace_dir, t0)
    forwards = tk.named(rs, stages.FORWARD)
    metas = [r for r in rs if r.name.startswith(stages.STEP_META_PREFIX)]
    assert len(metas) == len(forwards) == 4  # one prefill step, then three decode steps
    shapes = [stages.parse_step_meta(m.name) for m in metas]
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outs)
    assert shapes[0] == stages.StepShape(prompt_tokens, 0, prompt_tokens, 2)
    assert shapes[1:] == [stages.StepShape(0, 2, 2, 2)] * 3
    # Each forward joins the nearest preceding step_meta on its thread, inside the same step.
    for f in forwards:
        before = [m for m in metas if (m.pid, m.tid) == (f.pid, f.tid) and m.start <= f.start]
        assert before and max(before, key=lambda m: m.start).end <= f.start
    # The step_tokens log lines carry the same numbers; DEBUG but on every 50th step of the
    # process (the counter runs across engines), which is INFO.
    logged = [msg for level, msg in lines]
    assert [m.split(" ", 2)[2] for m in logged] == [
        f"prefill={s.prefill} decode={s.decode} total={s.total} num_reqs={s.reqs}" for s in shapes]
    for level, msg in lines:
        step = int(msg.split()[1].split("=")[1])
        assert level == (logging.INFO if step % 50 == 0 else logging.DEBUG)


def test_step_tokens_at_info_every_fiftieth_step(traced):
    llm, _, _, lines = traced
    lines.clear()
    generate(llm, [prompt([], "Count")], max_tokens=60)
    steps = [int(msg.split()[1].split("=")[1]) for _, msg in lines]
    info = [int(msg.split()[1].split("=")[1]) for level, msg in lines if level == logging.INFO]
    assert len(steps) == 60 and steps == list(range(steps[0], steps[0] + 60))
    assert info == [s for s in steps if s % 50 == 0] and 1 <= len(info) <= 2


def stage_counts(llm) -> dict[str, int]:
    return {m.labels["stage"]: m.count for m in llm.get_metrics()
            if m.name == "vllm:mm_stage_duration_seconds"}


def test_stage_histograms_hold_every_range_once_the_engine_is_idle(traced):
    # Worker durations travel in batches; the batch left when the last request finishes must
    # arrive too, so the histogram counts equal the ranges in the trace exactly.
    llm, _, trace_dir, _ = traced
    # A first request exports whatever the engine's start-up left (its multimodal warm-up
    # processes dummy images), so the baseline holds only what came before this test.
    generate(llm, [prompt([image(700)], "Warm?")])
    before, t0 = stage_counts(llm), now_us()
    generate(llm, [prompt([image(701)], "Counted?"), prompt([], "Text too")], max_tokens=6)
    rs = window(trace_dir, t0)
    after = stage_counts(llm)
    names = (stages.VIT_FORWARD, *EVERY_STEP, stages.hash_range("pil_image"),
             stages.processor_range("apply_hf_processor"))
    seen = {name: after.get(name, 0) - before.get(name, 0) for name in names}
    assert {n: v for n, v in seen.items() if n not in EVERY_STEP} == \
        {name: len(tk.named(rs, name)) for name in names if name not in EVERY_STEP}
    assert seen[stages.VIT_FORWARD] == 1
    # Gathering, merging and preparing the inputs run every step, a range each, but give a
    # sample only in the step that had multimodal embeddings: the image request's prefill.
    for name in EVERY_STEP:
        assert len(tk.named(rs, name)) >= 6 and seen[name] == 1
    assert stages.PREPARE_MM_INPUTS in after or runners.current() == runners.V2


def test_a_a_none_b_through_the_analyzer(traced, tmp_path):
    """The issue's workload, one request at a time, on its own trace: the step's ranges in every
    step, the encoder in exactly the two steps that ran it, every step_meta joined with its
    forward by `mmscope analyze` and every check ok; the stage histograms as exact as the tree."""
    llm, work, _, _ = traced
    tracing.configure("chrome", str(tmp_path))
    try:
        before, items0 = stage_counts(llm), work.items
        for request in ([image(801)], [image(801)], [], [image(802)]):
            generate(llm, [prompt(request, "Which?") if request else prompt([], "None?")])
        after = stage_counts(llm)
        tracing.flush()
    finally:
        tracing.configure("chrome", str(traced[2]))
    rs, _ = tk.load(tmp_path)
    steps = [r for r in rs if r.name.startswith(stages.STEP_META_PREFIX)]
    assert len(steps) == 4 * 3  # four requests of three tokens, one at a time
    for name in (stages.PREPROCESS, stages.FORWARD, stages.GATHER_MM_EMBEDDINGS,
                 stages.EMBED_INPUT_IDS):
        assert len(tk.named(rs, name)) == len(steps), name
    assert len(tk.named(rs, stages.VIT_FORWARD)) == 2 and work.items - items0 == 2
    assert not tk.named(rs, stages.PREPARE_MM_INPUTS) or runners.current() == runners.V1
    # Samples only where the step had multimodal work: two encoder batches, three prefills with
    # an image (the repeat gathers the cached embeddings too).
    seen = {name: after.get(name, 0) - before.get(name, 0) for name in SIBLINGS}
    assert seen == {stages.VIT_FORWARD: 2, **{name: 3 for name in EVERY_STEP},
                    stages.EC_LOAD: 0, stages.EC_SAVE: 0}
    report = subprocess.run([sys.executable, "-m", "mmscope.cli", "analyze", "--json",
                             "--no-cache", str(tmp_path)], capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    doc = json.loads(report.stdout)
    assert all(c["ok"] for c in doc["checks"]), doc["checks"]
    assert doc["steps"]["pairs"] == doc["steps"]["forwards"] == len(steps)
