"""The /metrics series the load verifier reads, in one place, as `mmscope.expose.readout` keys.

Keys drop the `vllm:` prefix and `_total` suffix (see `readout.series_key`); `exposed()` gives the
name a user sees on /metrics, for messages.
"""
from __future__ import annotations

from mmscope.expose import metrics
from mmscope.expose.readout import series_key
from mmscope.vocabulary import HIT_SOURCES, Feature  # noqa: F401 - HIT_SOURCES: the labels read


def _key(family: dict, wire_key: str) -> str:
    return series_key(family[wire_key][0], {})


# mmscope's encoder-cache series, by the names expose/metrics.py gives them
QUERIES = _key(metrics.COUNTERS, "queries")
HITS = _key(metrics.COUNTERS, "hits")
MISSES = _key(metrics.COUNTERS, "misses")
DEFERRALS = _key(metrics.COUNTERS, "deferrals")
EVICTIONS = _key(metrics.COUNTERS, "evictions")
PREFIX_COVERED = _key(metrics.COUNTERS, "prefix_covered")
HITS_BY_SOURCE = _key(metrics.LABELED, "hits_by_source")
# the same in embeddings: what the encoder's work is made of
QUERY_EMBEDS = _key(metrics.COUNTERS, "query_embeds")
HIT_EMBEDS = _key(metrics.COUNTERS, "hit_embeds")
PREFIX_COVERED_EMBEDS = _key(metrics.COUNTERS, "prefix_covered_embeds")
CAPACITY = _key(metrics.GAUGES, "capacity_embeds")
USAGE = _key(metrics.GAUGES, "usage_embeds")
COUNTERS = (QUERIES, HITS, MISSES, DEFERRALS, EVICTIONS, PREFIX_COVERED, QUERY_EMBEDS, HIT_EMBEDS,
            PREFIX_COVERED_EMBEDS)
GAUGES = (CAPACITY, USAGE)

# vLLM's own caches beside it: the processor cache (items) and the prefix cache (tokens).
OTHER_CACHES = ("mm_cache", "prefix_cache")


HOOK_OFF = series_key(metrics.HOOK_OFF[0], {})  # 1 once the hook turned itself off


def counts_off(values: dict[str, float]) -> str | None:
    """Why the encoder-cache counts are missing from a /metrics page whose accounting hook turned
    itself off (they are withdrawn, never zeros), or None."""
    import re

    for key, value in values.items():
        m = re.fullmatch(HOOK_OFF + r"\{feature=" + Feature.ACCOUNTING + r",hook=([^,}]+).*", key)
        if m and value > 0:
            return (f"the encoder-cache counts are off: mmscope's hook {m[1]} turned itself off "
                    "(`mmscope doctor --url` and the server's log say why)")
    return None


def exposed(key: str) -> str:
    suffix = "" if key in GAUGES else "_total"
    return f"vllm:{key}{suffix}"


def labeled(key: str, label: str, value: str) -> str:
    return f"{key}{{{label}={value}}}"


def by_source(source: str) -> str:
    return labeled(HITS_BY_SOURCE, "source", source)


def cache_queries(cache: str) -> str:
    return f"{cache}_queries"


def cache_hits(cache: str) -> str:
    return f"{cache}_hits"

# Each multimodal request's time to first token, by part and outcome (mmscope.expose.ttft_histograms).
TTFT_PARTS = "request_ttft_part_seconds"
TTFT_MM = "request_mm_time_to_first_token_seconds"
HISTOGRAMS = (TTFT_PARTS, TTFT_MM)


def ttft_requests(values: dict[str, float]) -> float | None:
    """Multimodal requests whose time to first token the server split; None where it does not."""
    keys = [f"{TTFT_MM}_count{{encoder_cache={o}}}" for o in ("hit", "miss")]
    return sum(values[k] for k in keys) if all(k in values for k in keys) else None

# The API server's media before the processor (mmscope.expose.metrics MEDIA), and the stage
# histogram whose mm:media:* stages time each fetch and decode.
MEDIA_BYTES = "mm_media_fetched_bytes"
MEDIA_FAILED = "mm_media_failed_fetches"
MEDIA_REDUNDANT = "mm_media_redundant_fetches"
MEDIA_REDUNDANT_S = "mm_media_redundant_fetch_seconds"
STAGES = "mm_stage_duration_seconds"

# vLLM's own time to first token, per request: each instance's share of a fleet run shows it.
VLLM_TTFT = "time_to_first_token_seconds"
READ_HISTOGRAMS = (*HISTOGRAMS, STAGES, VLLM_TTFT)  # what a level reads of /metrics
# Each instance's share of a level (another counter family can join as a row).
SHARES = (("queries", QUERIES), ("hits", HITS), ("misses", MISSES), ("evictions", EVICTIONS))
