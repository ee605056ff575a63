"""Encoder-cache accounting end to end in the offline engine: exact counts for scripted sequences,
budget deferrals, chunked prefill, preemption, probe lines (docs/design.md §4)."""
from __future__ import annotations

import logging

import pytest

from tests.kit.engine import EncoderWork, counters, image, offline_llm, prompt

pytestmark = [pytest.mark.vllm, pytest.mark.runners]

KEYS = ("encoder_cache_queries", "encoder_cache_hits", "encoder_cache_misses")


class ProbeLines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if "mm_cache_probe" in msg:
            self.lines.append(msg)


@pytest.fixture(scope="module")
def engine(tiny_model):
    import os
    os.environ["VLLM_MM_CACHE_PROBE"] = "1"
    work = EncoderWork()  # before the engine: a V2 runner wraps the model's method as it loads
    llm = offline_llm(tiny_model)
    work.reset()
    # After vLLM's logging set-up, which resets the handlers of existing vllm.* loggers.
    probe = ProbeLines()
    logging.getLogger("vllm.mmscope").addHandler(probe)
    yield llm, work, probe
    work.close()
    logging.getLogger("vllm.mmscope").removeHandler(probe)
    os.environ.pop("VLLM_MM_CACHE_PROBE")


def run(engine, prompts):
    """Counter deltas and encoder items for one generate() call."""
    from vllm import SamplingParams

    llm, work, _ = engine
    before, items_before = counters(llm), work.items
    llm.generate(prompts, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True),
                 use_tqdm=False)
    after = counters(llm)
    d = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    d["encoder_items"] = work.items - items_before
    return d


def q_h_m(d):
    return tuple(int(d.get(k, 0)) for k in KEYS)


def test_new_then_repeated_image(engine):
    d = run(engine, [prompt([image(1)])])
    assert q_h_m(d) == (1, 0, 1) and d["encoder_items"] == 1
    d = run(engine, [prompt([image(1)], "Again?")])
    assert q_h_m(d) == (1, 1, 0) and d["encoder_items"] == 0
    assert d["encoder_cache_hits_by_source{source=local}"] == 1


def test_several_images_per_request(engine):
    d = run(engine, [prompt([image(10), image(11), image(1)])])  # image(1) is resident
    assert q_h_m(d) == (3, 1, 2) and d["encoder_items"] == 2


def test_same_image_twice_in_one_request(engine):
    d = run(engine, [prompt([image(20), image(20)])])
    assert q_h_m(d) == (2, 1, 1) and d["encoder_items"] == 1
    assert d["encoder_cache_hits_by_source{source=in_step}"] == 1


def test_two_requests_with_the_same_new_image_in_one_step(engine):
    d = run(engine, [prompt([image(30)], "A?"), prompt([image(30)], "B?")])
    assert q_h_m(d) == (2, 1, 1) and d["encoder_items"] == 1
    assert d["encoder_cache_hits_by_source{source=in_step}"] == 1


def test_text_only_requests_count_nothing(engine):
    d = run(engine, [prompt([], "Hello there"), prompt([], "How are you")])
    assert q_h_m(d) == (0, 0, 0) and d["encoder_items"] == 0


def test_modality_breakdown_and_occupancy(engine):
    llm = engine[0]
    c = counters(llm)
    assert c["encoder_cache_queries_by_modality{modality=image}"] == c["encoder_cache_queries"]
    assert c["encoder_cache_capacity_embeds"] == 256  # = max_num_batched_tokens
    assert 0 < c["encoder_cache_usage_embeds"] <= 256


def test_probe_lines_agree_with_counters(engine):
    llm, _, probe = engine
    c = counters(llm)
    hits = [ln for ln in probe.lines if "mm_cache_probe HIT" in ln]
    misses = [ln for ln in probe.lines if "mm_cache_probe MISS" in ln]
    assert len(hits) == c["encoder_cache_hits"] and len(misses) == c["encoder_cache_misses"]
    assert all("hash=" in ln and "embeds=16" in ln and "What" not in ln for ln in probe.lines)


def test_offline_stats_line_carries_encoder_hit_rate(engine):
    llm = engine[0]
    stats_logger = logging.getLogger("vllm.v1.metrics.loggers")
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    stats_logger.addHandler(handler)
    try:
        run(engine, [prompt([image(1)], "Stats?")])  # a resident image: a hit in the window
        llm.llm_engine.do_log_stats()
    finally:
        stats_logger.removeHandler(handler)
    line = next(ln for ln in lines if "Avg prompt throughput" in ln)
    c = counters(llm)
    rate = 100 * c["encoder_cache_hits"] / c["encoder_cache_queries"]
    saved = 100 * (c["encoder_cache_hit_embeds"] + c["encoder_cache_prefix_covered_embeds"]) / (
        c["encoder_cache_query_embeds"] + c["encoder_cache_prefix_covered_embeds"])
    assert f"Encoder cache hit rate: {rate:.1f}%, Encoder work saved: {saved:.1f}% of embeddings" \
        in line


# --- the prefix cache: items it spares are their own outcome (docs/design.md §4), not queries ----------
def _text_of_tokens(llm, n: int, word: str) -> str:
    """Text that the tiny model's tokenizer turns into at least n tokens."""
    tokenizer = llm.get_tokenizer()
    text = word
    while len(tokenizer.encode(text)) < n:
        text += " " + word
    return text


def test_a_repeated_long_prompt_spares_the_encoder_through_the_prefix_cache(engine):
    llm = engine[0]
    # The image first, then three 128-token blocks of text: a repeat of the whole prompt finds
    # the image's placeholders in prefix-cached blocks, and vLLM never looks the item up.
    long = prompt([image(40)], _text_of_tokens(llm, 3 * 128, "tree"))
    d = run(engine, [long])
    assert q_h_m(d) == (1, 0, 1) and d["encoder_items"] == 1
    assert d["encoder_cache_prefix_covered"] == 0
    for _ in range(2):
        d = run(engine, [long])
        assert q_h_m(d) == (0, 0, 0) and d["encoder_items"] == 0
        assert d["encoder_cache_prefix_covered"] == 1
        assert d["encoder_cache_prefix_covered_by_modality{modality=image}"] == 1
    _, _, probe = engine
    assert sum("mm_cache_probe PREFIX_COVERED" in ln and "hash=" in ln for ln in probe.lines) == 2


def test_an_item_the_prefix_cache_covers_only_in_part_is_queried(engine):
    llm = engine[0]
    # Text up to a few tokens before the first 128-token block's end, the image across the
    # boundary, then text that differs between the two requests: the second finds only the first
    # block cached, which holds part of the item, so the encoder output is needed again (here
    # resident in the encoder cache: a local hit) and the item counts as the query it is.
    tokenizer = llm.get_tokenizer()
    head = _text_of_tokens(llm, 120, "leaf")
    while len(tokenizer.encode("<s>user: " + head)) > 124:
        head = head[:-1]

    def request(tail_word):
        return {"prompt": "<s>user: " + head + "<image>" + _text_of_tokens(llm, 2 * 128, tail_word)
                + "\nassistant:", "multi_modal_data": {"image": image(41)}}

    d = run(engine, [request("root")])
    assert q_h_m(d) == (1, 0, 1)
    d = run(engine, [request("stem")])
    assert d["prefix_cache_hits"] == 128  # the first block only
    assert q_h_m(d) == (1, 1, 0) and d["encoder_items"] == 0
    assert d["encoder_cache_prefix_covered"] == 0
