"""Each item's way through the cache layers on a live OpenAI server, vLLM's processor cache on (the
test run's traced server): chats A, A, B, A, A+B counted once each, by the processor cache's
answer and where their embeddings came from; the sums equal vLLM's `vllm:mm_cache_*` and mmscope's
encoder-cache counters; each layer that served an item saved measured seconds."""
from __future__ import annotations

import re
import time
from collections import Counter

import pytest

from mmscope.demo.tiny_llava import IMAGE_TOKENS
from tests.kit.server import chat, histograms, metrics

pytestmark = pytest.mark.vllm

A, B, C = 9501, 9502, 9503  # images no other test sends
CHATS = [([A], "First look?"), ([A], "Again?"), ([B], "Another one?"), ([A], "Back to it?"),
         ([A, B], "Both together?")]
LONG_TEXT = "Describe the picture in every detail, please. " * 40  # over a KV block after it
SETTLE_S = 15.0
ITEMS = "mm_items"
SAVED = "mm_work_saved_seconds"
SIZES = ("mm_item_embeddings", "mm_item_bytes")


def reading(url: str) -> dict[str, float]:
    return histograms(url, *SIZES)


def settled(url: str, before: dict, items: int) -> dict[str, float]:
    """The delta once `items` items reached their way on /metrics, and vLLM's processor-cache
    counts with them (the stats of the last step follow its answer)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        now = reading(url)
        delta = {k: now.get(k, 0) - before.get(k, 0) for k in set(now) | set(before)}
        if sum(v for k, v in delta.items() if k.startswith(ITEMS + "{")) >= items \
                or time.monotonic() > deadline:
            time.sleep(1.2)  # one more update: vLLM's own counts come with its next stats
            now = reading(url)
            return {k: now.get(k, 0) - before.get(k, 0) for k in set(now) | set(before)}
        time.sleep(0.2)


def ways(delta: dict[str, float]) -> tuple[Counter, Counter]:
    """(processor way -> items, encoder way -> items), the zeros left out."""
    processor, encoder = Counter(), Counter()
    for key, n in delta.items():
        m = re.fullmatch(ITEMS + r"\{encoder=(\w+),modality=image,processor=(\w+)\}", key)
        if m and n:
            processor[m[2]] += n
            encoder[m[1]] += n
    return processor, encoder


def saved(delta: dict[str, float]) -> dict[str, float]:
    return {k[len(SAVED) + len("{layer="):-1]: v for k, v in delta.items()
            if k.startswith(SAVED + "{")}


def agree_with_the_counters(delta: dict[str, float], processor_cache: bool = True) -> None:
    """The items' ways add up to vLLM's processor-cache counts and to mmscope's encoder cache."""
    processor, encoder = ways(delta)
    if processor_cache:
        assert processor["hit"] == delta["mm_cache_hits"]
        assert processor["hit"] + processor["miss"] == delta["mm_cache_queries"]
    else:
        assert delta.get("mm_cache_queries", 0) == 0 and not processor["hit"] + processor["miss"]
    assert encoder["computed"] == delta["encoder_cache_misses"]
    assert encoder["cache_hit"] == (delta["encoder_cache_hits_by_source{source=local}"]
                                    + delta["encoder_cache_hits_by_source{source=in_step}"])
    assert encoder["ec_loaded"] == delta["encoder_cache_hits_by_source{source=connector}"]
    assert encoder["prefix_covered"] == delta["encoder_cache_prefix_covered"]


def test_chats_a_a_b_a_ab_each_item_counted_once_by_its_way(traced_server):
    url, model = traced_server.url, traced_server.model
    before = reading(url)
    for images, text in CHATS:
        chat(url, model, images, text)
    delta = settled(url, before, 6)
    processor, encoder = ways(delta)
    assert processor == {"hit": 4, "miss": 2}
    assert encoder == {"computed": 2, "cache_hit": 4}
    assert (delta["mm_cache_queries"], delta["mm_cache_hits"]) == (6, 4)  # vLLM's own
    agree_with_the_counters(delta)
    work = saved(delta)
    assert work["processor_cache"] > 0 and work["encoder_cache"] > 0
    assert work["prefix_cache"] == work["ec_connector"] == 0
    # each item's size: its embeddings, and the bytes of its data URL
    assert delta["mm_item_embeddings_count{modality=image}"] == 6
    assert delta["mm_item_embeddings_sum{modality=image}"] == 6 * IMAGE_TOKENS
    assert delta["mm_item_bytes_count{modality=image,source=data_url}"] == 6
    assert delta["mm_item_bytes_sum{modality=image,source=data_url}"] > 0
    assert metrics(url)["mm_encoder_seconds_per_embedding{modality=image}"] > 0


def test_an_item_the_prefix_cache_covers(traced_server):
    """The image, then three KV blocks of text: the repeat's image tokens are all prefix-cache
    hits, so the encoder is never asked; the processor cache held it."""
    url, model = traced_server.url, traced_server.model
    before = reading(url)
    for _ in range(2):
        chat(url, model, [C], LONG_TEXT)
    delta = settled(url, before, 2)
    assert ways(delta) == ({"miss": 1, "hit": 1}, {"computed": 1, "prefix_covered": 1})
    agree_with_the_counters(delta)
    work = saved(delta)
    assert work["prefix_cache"] > 0 and work["processor_cache"] > 0
    assert work["encoder_cache"] == work["ec_connector"] == 0


def test_the_stats_line_says_what_the_caches_saved(traced_server):
    deadline = time.monotonic() + 30
    found = []
    while not found and time.monotonic() < deadline:
        found = re.findall(r"Cache work saved: ([\d.]+) s", traced_server.log_text())
        time.sleep(0.5)
    assert found and max(map(float, found)) > 0
