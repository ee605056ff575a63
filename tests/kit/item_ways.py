"""Each item's way read off /metrics: the chats of the cache-layer tests, the delta once their
items settled, the items by way, the work saved by layer, and the sums checked against the counters."""
from __future__ import annotations

import re
import time
from collections import Counter

from tests.kit.server import histograms

A, B = 9501, 9502  # images no other test sends
CHATS = [([A], "First look?"), ([A], "Again?"), ([B], "Another one?"), ([A], "Back to it?"),
         ([A, B], "Both together?")]
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
