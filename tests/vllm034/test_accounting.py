"""docs/design.md §4 on vLLM 0.34's real Scheduler and EncoderCacheManager, model-free (the way
vLLM's own tests/v1/core drive them), with exact counts in items and embeddings: every rule, and
0.34's changes read in docs/vllm-0.34.md (resumed requests sent as new ones, the free-on-hit
branch with chunked prefill off, the `disable_chunked_mm_input` case of a chunk inside an item).

The counts are what the plugin's hooks hand to each step's SchedulerStats: the wire vLLM carries
to the API server, summed over the steps.
"""
from __future__ import annotations

from collections import Counter

import pytest

from mmscope.vllm.engine_core import handoff as engine_stats
from tests.kit.vllm034_scheduler import Driver, Item, create_scheduler, make_request

EMBEDS = 16  # each test image: a 16-token placeholder, one embedding a token


@pytest.fixture(autouse=True)
def every_step_sends():
    """The counts leave with every step's stats (the engine sends them at most once a second)."""
    saved, engine_stats.SEND_EVERY_S = engine_stats.SEND_EVERY_S, 0.0
    yield
    engine_stats.SEND_EVERY_S = saved


def counts(steps) -> Counter:
    """The wire's counts, summed over the steps' stats; gauges left out."""
    total = Counter()
    for step in steps:
        for eco in (step.engine_outputs or {}).values():
            wire = eco.scheduler_stats and eco.scheduler_stats.encoder_cache_stats
            total.update({k: v for k, v in (wire or {}).items() if not k.startswith(
                ("usage_", "capacity_"))})
    return total


def image(key: str, offset: int = 4, length: int = EMBEDS) -> Item:
    return Item(f"img-{key}", offset=offset, length=length)


def one_by_one(driver: Driver, *requests) -> list:
    """Each request added once the one before has finished: a repeat finds its item resident."""
    steps = []
    for request in requests:
        driver.add(request)
        steps += driver.run()
    return steps


def test_a_a_text_b_counts_queries_3_hits_1_misses_2(tiny_model):
    """The issue's workload: a new image, its repeat, a text-only request, another new image."""
    scheduler = create_scheduler(tiny_model, encoder_cache_size=256, encoder_compute_budget=256)
    driver = Driver(scheduler)
    steps = one_by_one(driver, make_request(scheduler, "a1", 40, [image("A")]),
                       make_request(scheduler, "a2", 40, [image("A")], prompt_token=6),
                       make_request(scheduler, "text", 40, prompt_token=8),
                       make_request(scheduler, "b", 40, [image("B")], prompt_token=9))
    c = counts(steps)
    assert (c["queries"], c["hits"], c["misses"]) == (3, 1, 2)
    assert (c["query_embeds"], c["hit_embeds"], c["miss_embeds"]) == (3 * EMBEDS, EMBEDS,
                                                                      2 * EMBEDS)
    assert (c["hits_by_source:local"], c["queries_by_modality:image"]) == (1, 3)
    assert c["requests"] == 3  # the text request committed no item
    assert sum(len(s.encoder_inputs.get(r, [])) for s in steps for r in s.encoder_inputs) == 2


def test_two_copies_in_one_step_are_a_miss_and_an_in_step_hit(tiny_model):
    scheduler = create_scheduler(tiny_model, encoder_cache_size=256, encoder_compute_budget=256)
    driver = Driver(scheduler)
    driver.add(make_request(scheduler, "x", 40, [image("A")]),
               make_request(scheduler, "y", 40, [image("A")], prompt_token=6))
    c = counts(driver.run())
    assert (c["queries"], c["hits"], c["misses"], c["hits_by_source:in_step"]) == (2, 1, 1, 1)


def test_an_item_evicted_for_room_is_counted_and_computed_again(tiny_model):
    """Room for two images: the third evicts the oldest freeable entry, which is a miss again."""
    scheduler = create_scheduler(tiny_model, encoder_cache_size=2 * EMBEDS,
                                 encoder_compute_budget=2 * EMBEDS)
    driver = Driver(scheduler)
    steps = one_by_one(driver, *[make_request(scheduler, f"r{i}", 40, [image(key)],
                                              prompt_token=10 + i)
                                 for i, key in enumerate("ABCA")])
    c = counts(steps)
    assert (c["queries"], c["hits"], c["misses"], c["evictions"]) == (4, 0, 4, 2)


def test_a_deferred_item_is_a_deferral_then_the_query_it_becomes(tiny_model):
    """An encoder budget of one image a step: the second new image waits a step."""
    scheduler = create_scheduler(tiny_model, encoder_cache_size=256,
                                 encoder_compute_budget=EMBEDS)
    driver = Driver(scheduler)
    driver.add(make_request(scheduler, "x", 40, [image("A")]),
               make_request(scheduler, "y", 40, [image("B")], prompt_token=6))
    steps = driver.run()
    c = counts(steps)
    assert (c["queries"], c["misses"], c["deferrals"]) == (2, 2, 1)
    assert [s.encoder_inputs for s in steps[:2]] == [{"x": [0]}, {"y": [0]}]


def test_with_chunked_prefill_off_a_prompt_the_encoder_would_split_waits_and_its_hit_is_not_counted(
        tiny_model):
    """0.34's free-on-hit branch: y holds a resident image and a new one the step's encoder
    budget cannot take (z took it). vLLM does not split y's prompt: it frees the reference its hit
    took and schedules y whole a step later. The step that did not schedule y counts one deferral
    and no query; y's two items are queried once, when it runs."""
    scheduler = create_scheduler(tiny_model, enable_chunked_prefill=False,
                                 max_num_batched_tokens=512, encoder_cache_size=256,
                                 encoder_compute_budget=EMBEDS)
    driver = Driver(scheduler)
    first = one_by_one(driver, make_request(scheduler, "x", 40, [image("A")]))
    driver.add(make_request(scheduler, "z", 40, [image("C")], prompt_token=7),
               make_request(scheduler, "y", 60, [image("A", 4), image("B", 30)],
                            prompt_token=6))
    waited = driver.step()
    assert waited.num_scheduled_tokens == {"z": 40}
    assert counts([waited])["deferrals"] == 1 and counts([waited])["hits"] == 0
    assert "y" not in scheduler.encoder_cache_manager.cached.get("img-A", set())  # released
    c = counts(first + [waited] + driver.run())
    assert (c["queries"], c["hits"], c["misses"], c["deferrals"]) == (4, 1, 3, 1)


def test_with_disable_chunked_mm_input_a_chunk_inside_an_item_waits_without_a_query(tiny_model):
    """0.34: a chunk that starts inside an item (its prefix hit ends there) and cannot cover it
    gets 0 tokens. p2 repeats p1 (prefix hit to token 48, inside the image at 40..56); t, first
    in the step, leaves p2 4 tokens of the 64. p2 waits a step, then its partly covered image is
    queried (a local hit: p1's entry is resident), not counted as prefix-covered."""
    scheduler = create_scheduler(tiny_model, max_num_batched_tokens=64,
                                 disable_chunked_mm_input=True, encoder_cache_size=256,
                                 encoder_compute_budget=256)
    driver = Driver(scheduler)
    first = one_by_one(driver, make_request(scheduler, "p1", 64, [image("A", offset=40)]))
    driver.add(make_request(scheduler, "t", 60, prompt_token=8),
               make_request(scheduler, "p2", 64, [image("A", offset=40)]))
    waited = driver.step()
    assert waited.num_scheduled_tokens == {"t": 60}
    assert counts([waited])["queries"] == 0 and counts([waited])["deferrals"] == 0
    c = counts(first + [waited] + driver.run())
    assert (c["queries"], c["hits"], c["misses"], c["prefix_covered"]) == (2, 1, 1, 0)


def test_an_item_inside_a_prefix_hit_is_prefix_covered_not_a_query(tiny_model):
    """p2 repeats p1: its prefix hit (48 tokens, 3 blocks) holds the whole image at 8..24."""
    scheduler = create_scheduler(tiny_model, encoder_cache_size=256, encoder_compute_budget=256)
    driver = Driver(scheduler)
    steps = one_by_one(driver, make_request(scheduler, "p1", 64, [image("A", offset=8)]),
                       make_request(scheduler, "p2", 64, [image("A", offset=8)]))
    c = counts(steps)
    assert (c["queries"], c["misses"], c["prefix_covered"], c["prefix_covered_embeds"]) == (
        1, 1, 1, EMBEDS)


def test_a_preempted_request_commits_its_items_again_when_it_resumes_as_a_new_one(tiny_model):
    """0.34 sends a resumed request in full, as a new one. A KV cache of 8 blocks of 16 tokens
    holds two 40-token requests (3 blocks each) but not both through 20 decoded tokens: the later
    one is preempted, its encoder entries freed, and when it resumes its image is committed again
    (resident still: a local hit)."""
    scheduler = create_scheduler(tiny_model, num_blocks=8, encoder_cache_size=256,
                                 encoder_compute_budget=256)
    driver = Driver(scheduler)
    driver.add(make_request(scheduler, "x", 40, [image("A")], max_tokens=24),
               make_request(scheduler, "y", 40, [image("B")], max_tokens=24, prompt_token=6))
    steps = driver.run()
    assert any(s.output.preempted_req_ids for s in steps), "nothing was preempted"
    resumed = [s for s in steps[1:] if any(r.req_id == "y" for r in s.output.scheduled_new_reqs)]
    assert resumed, "y did not come back as a new request"
    c = counts(steps)
    assert c["queries"] + c["prefix_covered"] == 3  # x's A, y's B, y's B again on resuming
    assert c["misses"] == 2 and c["hits"] + c["prefix_covered"] == 1
