"""Each item's way through the cache layers on a live OpenAI server, vLLM's processor cache on (the
test run's traced server): chats A, A, B, A, A+B counted once each, by the processor cache's
answer and where their embeddings came from; the sums equal vLLM's `vllm:mm_cache_*` and mmscope's
encoder-cache counters; each layer that served an item saved measured seconds."""
from __future__ import annotations

import re
import time

import pytest

from mmscope.demo.tiny_llava import IMAGE_TOKENS
from tests.kit.item_ways import CHATS, agree_with_the_counters, reading, saved, settled, ways
from tests.kit.server import chat, metrics

pytestmark = pytest.mark.vllm

C = 9503  # an image no other test sends
LONG_TEXT = "Describe the picture in every detail, please. " * 40  # over a KV block after it


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
