"""`mmscope load`'s verdict at its boundaries and every figure its report prints, on levels whose
numbers are all different, so that a figure swapped for another or a boundary moved by one fails."""
from __future__ import annotations

import pytest

from mmscope import stages
from mmscope.load.observed import series
from mmscope.load.client import Timing
from mmscope.load.plan import LevelPlan, PlannedRequest
from mmscope.load.report import RunInfo, level_json, print_terminal, run_json
from mmscope.load.sweep import LevelResult, RequestResult
from mmscope.load.verdict import EXCESS, EXPLAINED, MATCH, UNEXPLAINED, Observed, judge, lru_hits


def scripted(reuse: float, *images_per_request: tuple[int, ...]) -> LevelPlan:
    requests, seen = [], set()
    for n, images in enumerate(images_per_request):
        requests.append(PlannedRequest(n, images, tuple(i in seen for i in images), f"r{n}"))
        seen.update(images)
    return LevelPlan(0, reuse, tuple(requests))


# Six requests; 2, 4 and 5 repeat images 0, 1, 0: 3 planned hits of 6 images, 3 distinct.
SIX = scripted(0.5, (0,), (1,), (0,), (2,), (1,), (0,))
LRU_AT_32 = 1  # two 16-embed slots: 0,1 | 0 hits | 2 evicts 1 | 1 misses, evicts 0 | 0 misses


def verdict(hits: int, evictions: int, queries: int = 6):
    return judge(SIX, Observed(queries, hits, evictions, 32, 16), lru_hits(SIX, 32, 16))


CAPACITY = "capacity 32 embeds; an LRU of that size allows 1 hits"


@pytest.mark.parametrize("hits,evictions,status,text", [
    (3, 0, MATCH, "hits match the plan (3 of 3)"),
    (4, 0, EXCESS, "1 hits more than planned: other traffic on the server, or images still "
                   "cached from an earlier run with the same --seed"),
    # shortfall == evictions: the last shortfall capacity explains
    (1, 2, EXPLAINED, f"1 of 3 planned hits; shortfall explained by capacity (2 evictions, "
                      f"{CAPACITY})"),
    (2, 1, EXPLAINED, f"2 of 3 planned hits; shortfall explained by capacity (1 evictions, "
                      f"{CAPACITY})"),
    # shortfall == evictions + 1: the first it does not
    (1, 1, UNEXPLAINED, f"1 of 3 planned hits; 1 hits missing that capacity does not explain "
                        f"(1 evictions, {CAPACITY})"),
    (0, 1, UNEXPLAINED, f"0 of 3 planned hits; 2 hits missing that capacity does not explain "
                        f"(1 evictions, {CAPACITY})"),
    (2, 0, UNEXPLAINED, f"2 of 3 planned hits; 1 hits missing that capacity does not explain "
                        f"(0 evictions, {CAPACITY})"),
])
def test_verdict_at_its_boundaries(hits, evictions, status, text):
    v = verdict(hits, evictions)
    assert (v.status, v.text) == (status, text)
    assert v.ok is (status != UNEXPLAINED)


@pytest.mark.parametrize("queries,note", [
    (6, ""),
    (7, "; 7 queries for 6 images (requests preempted and resumed, or other traffic)"),
    (5, "; 5 queries for 6 images (lookups skipped: a prefix-cache hit may cover images)"),
])
def test_queries_note_at_its_boundaries(queries, note):
    assert verdict(3, 0, queries).text == "hits match the plan (3 of 3)" + note


def test_verdict_without_capacity_figures():
    v = judge(SIX, Observed(6, 1, 2, None, 16))
    assert v.text == ("1 of 3 planned hits; shortfall explained by capacity (2 evictions, "
                      "capacity unknown)")


# --- every figure of the report -----------------------------------------------------------------
def timed(plan: LevelPlan) -> list[RequestResult]:
    """Request i: first token after (i + 1) * 10 ms, done after 100 + 10 i ms."""
    return [RequestResult(r, Timing(0.01 * (1 + r.index), 0.1 + 0.01 * r.index, 20, 2))
            for r in plan.requests]


def busy_level() -> LevelResult:
    delta = {series.QUERIES: 7, series.HITS: 2, series.MISSES: 5, series.DEFERRALS: 3,
             series.EVICTIONS: 1, series.by_source("local"): 1, series.by_source("in_step"): 0,
             series.by_source("connector"): 1, series.cache_queries("mm_cache"): 9,
             series.cache_hits("mm_cache"): 4, series.cache_queries("prefix_cache"): 320,
             series.cache_hits("prefix_cache"): 64, series.QUERY_EMBEDS: 112,
             series.HIT_EMBEDS: 32, series.PREFIX_COVERED_EMBEDS: 16, **SERVER_TTFT,
             **VLLM_TTFT, **SERVER_MEDIA, **SERVER_LAYERS}
    return LevelResult(SIX, timed(SIX), 1.5, {URL: delta}, {URL: 32}, 16, build_s=0.25)


# Each item's way over the level: the processor cache held the 3 repeats; the encoder cache
# served one, the EC connector one, and the encoder computed 4 (one more than the distinct 3).
SERVER_LAYERS = {
    **{f"mm_items{{encoder={e},modality=image,processor={p}}}": n for (p, e), n in (
        (("hit", "cache_hit"), 1), (("hit", "ec_loaded"), 1), (("hit", "computed"), 1),
        (("miss", "computed"), 3))},
    "mm_work_saved_seconds{layer=processor_cache}": 0.003,
    "mm_work_saved_seconds{layer=encoder_cache}": 0.01,
    "mm_work_saved_seconds{layer=ec_connector}": 0.002}
BUSY_LAYERS = {
    "planned": {"processor": {"hit": 3, "miss": 3, "off": 0}, "spared": 3, "computed": 3},
    "observed": {"items": 6, "spared": 2,
                 "encoder": {"cache_hit": 1, "prefix_covered": 0, "ec_loaded": 1, "computed": 4},
                 "processor": {"hit": 3, "miss": 3, "off": 0},
                 "saved_s": {"processor_cache": 0.003, "prefix_cache": 0.0,
                             "encoder_cache": 0.01, "ec_connector": 0.002}}}

# The server's media counts over the level: six data URLs fetched in 12 ms and decoded in 18 ms
# in all, 6000 bytes, three of them already in the processor cache (4.5 ms of it).
SERVER_MEDIA = {f"{series.STAGES}_{kind}{{stage=mm:media:{step}:data_url:image}}": value
                for step, total in (("fetch", 0.012), ("decode", 0.018))
                for kind, value in (("sum", total), ("count", 6))}
SERVER_MEDIA.update({f"{key}{{modality=image,source=data_url}}": value for key, value in (
    (series.MEDIA_BYTES, 6000), (series.MEDIA_REDUNDANT, 3), (series.MEDIA_REDUNDANT_S, 0.0045))})
SERVER_MEDIA[f"{series.MEDIA_FAILED}{{modality=image,source=data_url,step=fetch}}"] = 0
BUSY_MEDIA = {"by_source": {"data_url": {
    "requests": 6, "items": 6, "fetch_ms": {"mean": 2.0, "total": 12.0},
    "decode_ms": {"mean": 3.0, "total": 18.0}, "bytes": 6000, "failed": 0,
    "redundant_fetches": 3, "redundant_ms": 4.5,
    # client TTFTs 10..60 ms
    "ttft_ms": {"p50": 35.0, "p90": 55.0}}}, "fetches": None}


# The server's TTFT histograms over the level: six misses, 180 ms in all (the client measured
# 210 ms: 5 ms each beyond), two to 25 ms and four more to 50 ms; each one's encoder share 10 ms.
T, P = series.TTFT_MM, series.TTFT_PARTS
SERVER_TTFT = {
    f"{T}_count{{encoder_cache=miss}}": 6, f"{T}_sum{{encoder_cache=miss}}": 0.18,
    f"{T}_bucket{{encoder_cache=miss,le=0.025}}": 2, f"{T}_bucket{{encoder_cache=miss,le=0.05}}": 6,
    f"{T}_bucket{{encoder_cache=miss,le=+Inf}}": 6,
    f"{P}_count{{encoder_cache=miss,part=encoder}}": 6,
    f"{P}_sum{{encoder_cache=miss,part=encoder}}": 0.06,
    f"{P}_bucket{{encoder_cache=miss,le=0.01,part=encoder}}": 6,
    f"{P}_bucket{{encoder_cache=miss,le=+Inf,part=encoder}}": 6,
}
# vLLM's own time to first token of the same six requests.
V = series.VLLM_TTFT
VLLM_TTFT = {f"{V}_count": 6, f"{V}_sum": 0.18, f"{V}_bucket{{le=0.025}}": 2,
             f"{V}_bucket{{le=0.05}}": 6, f"{V}_bucket{{le=+Inf}}": 6}
NONE = {"mean_ms": None, "p50_ms": None, "p90_ms": None}
URL = "http://x:1"
BUSY_TTFT_PARTS = {
    "hit": {"requests": 0, "ttft": NONE, "parts": {p: NONE for p in stages.TTFT_PARTS}},
    # p50: rank 3 of 6, a quarter into (25, 50] ms; p90: rank 5.4, 85% into it
    "miss": {"requests": 6, "ttft": {"mean_ms": 30.0, "p50_ms": 31.25, "p90_ms": 46.25},
             "parts": {p: {"mean_ms": 10.0, "p50_ms": 5.0, "p90_ms": 9.0} if p == "encoder"
                       else NONE for p in stages.TTFT_PARTS}},
    "client_beyond_server_mean_ms": 5.0,
}


def quiet_level() -> LevelResult:
    """Nothing repeats, the server said no capacity, and the wall time is 2 s."""
    plan = LevelPlan(1, 0.0, scripted(0.0, (5,), (6,)).requests)
    return LevelResult(plan, timed(plan), 2.0, {URL: {series.QUERIES: 2, series.MISSES: 2}},
                       {URL: None}, 16)


BUSY_JSON = {
    "reuse": 0.5, "requests": 6, "images": 6, "distinct_images": 3, "planned_hits": 3,
    "planned_hit_rate": 0.5, "observed_queries": 7, "observed_hits": 2, "observed_misses": 5,
    "observed_hit_rate": 0.2857, "observed_prefix_covered": 0, "observed_avoided_rate": 0.3333,
    # in embeddings (16 an image): 2 of 7 queries hit, and one image's worth spared by the prefix
    # cache (the counters need not agree with the item ones: this level is made up)
    "observed_query_embeds": 112, "observed_hit_embeds": 32, "observed_prefix_covered_embeds": 16,
    "observed_embed_hit_rate": 0.2857, "observed_saved_embed_rate": 0.375,
    "hits_by_source": {"local": 1, "in_step": 0, "connector": 1},
    "deferrals": 3, "evictions": 1, "capacity_embeds": 32, "embeds_per_image": 16,
    "capacity_allows_hits": LRU_AT_32,
    "mm_cache": {"queries": 9, "hits": 4}, "prefix_cache": {"queries": 320, "hits": 64},
    "repeat_requests": 3,
    # repeats: requests 2, 4, 5 (30, 50, 60 ms); new: 0, 1, 3 (10, 20, 40 ms)
    "ttft_ms": {"repeat_p50": 50.0, "repeat_p90": 58.0, "new_p50": 20.0, "new_p90": 36.0},
    "ttft_parts": BUSY_TTFT_PARTS,
    "media": BUSY_MEDIA,
    "e2e_ms": {"p50": 125.0, "p90": 145.0},
    "wall_s": 1.5, "throughput_rps": 4.0, "build_s": 0.25,
    # one instance: the whole level, vLLM's TTFT as the split's (p50: 31.25, p90: 46.25 ms)
    "instances": {URL: {"requests": 6, "planned_hits": None, "queries": 7, "hits": 2, "misses": 5,
                        "evictions": 1, "hit_rate": 0.2857, "capacity_embeds": 32,
                        "ttft_ms": {"mean_ms": 30.0, "p50_ms": 31.25, "p90_ms": 46.25}}},
    "router": None,
    "layers": BUSY_LAYERS,
    "verdict": {"status": EXPLAINED, "text": (
        f"2 of 3 planned hits; shortfall explained by capacity (1 evictions, {CAPACITY}); 7 "
        "queries for 6 images (requests preempted and resumed, or other traffic); layers: the "
        "encoder computed 4 items for 3 distinct images")},
}


def test_level_json_holds_every_figure():
    assert level_json(busy_level()) == BUSY_JSON
    quiet = level_json(quiet_level())
    assert quiet["ttft_ms"] == {"repeat_p50": None, "repeat_p90": None, "new_p50": 15.0,
                                "new_p90": 19.0}
    assert (quiet["capacity_allows_hits"], quiet["throughput_rps"], quiet["planned_hit_rate"]) \
        == (None, 1.0, 0.0)
    assert quiet["media"] == {"by_source": {}, "fetches": None}  # the server counted none


def test_run_json_holds_the_run_and_every_level():
    info = RunInfo((URL,), "m", 5, 6, 1, 2, (32, 24), 16)
    out = run_json(info, [busy_level(), quiet_level()])
    levels = out.pop("levels")
    assert out == {"urls": [URL], "model": "m", "seed": 5,
                   "shard": {"part": 1, "of": 1, "lanes": 1},
                   "counters": "/metrics of the server", "requests_per_level": 6,
                   "images_per_request": 1, "concurrency": 2, "image_size": [32, 24],
                   "embeds_per_image": 16, "prefix_plan": False, "ok": True,
                   "media": {"sources": ["data_url"], "format": "png", "latency_ms": 0.0,
                             "jitter_ms": 0.0, "vary_urls": False}}
    assert levels[0] == BUSY_JSON and len(levels) == 2


def printed(info: RunInfo, levels: list[LevelResult]) -> list[str]:
    from rich.console import Console

    console = Console(record=True, width=400)
    print_terminal(info, levels, console)
    return console.export_text().splitlines()


def table_rows(lines: list[str]) -> list[list[str]]:
    return [[c.strip() for c in ln.split("│")[1:-1]] for ln in lines if ln.startswith("│")]


def test_terminal_report_prints_every_figure():
    info = RunInfo((URL,), "m", 5, 6, 1, 2, (32, 24), 16)
    lines = printed(info, [busy_level(), quiet_level()])
    assert lines[:4] == ["mmscope load: http://x:1, model m, seed 5",
                         "per level: 6 requests of 1 image, concurrency 2; 32x24 png images "
                         "(16 embeds each); encoder cache 32 embeds",
                         "images sent as data_url",
                         "encoder cache per reuse level"]
    assert table_rows(lines) == [
        # reuse, requests, images, planned hits, queries, hits, prefix covered, hit rate (plan),
        # embeds hit, avoided, embeds saved, TTFT repeat, TTFT new, req/s
        ["0.5", "6", "6", "3", "7", "2", "0", "29% (50%)", "29%", "33%", "38%", "50.0 / 58.0",
         "20.0 / 36.0", "4.00"],
        ["0", "2", "2", "0", "2", "0", "0", "0% (0%)", "-", "0%", "-", "- / -", "15.0 / 19.0",
         "1.00"],
        # reuse, local, in_step, connector, deferrals, evictions, capacity allows, mm, prefix
        ["0.5", "1", "0", "1", "3", "1", "1", "4 / 9", "64 / 320"],
        ["0", "0", "0", "0", "0", "0", "-", "0 / 0", "0 / 0"],
        # reuse, processor hit, miss, off (planned), encoder cache, prefix cache, EC connector,
        # spared (planned), computed (planned), work saved s
        ["0.5", "3 (3)", "3 (3)", "0 (0)", "1", "0", "1", "2 (3)", "4 (3)", "0.015"],
        # reuse, outcome, requests, TTFT, media, render, processor, queue, encoder, ec_load,
        # prefill, other, beyond
        ["0.5", "miss", "6", "31.2 / 46.2", "- / -", "- / -", "- / -", "- / -", "5.0 / 9.0",
         "- / -", "- / -", "- / -", "5.0"],
        # reuse, source, requests, items, fetch ms, decode ms, KiB, though cached, failed, TTFT
        ["0.5", "data_url", "6", "6", "2.0", "3.0", "5.9", "3 (4 ms)", "0", "35.0 / 55.0"],
    ]
    assert "hits by source, capacity, and vLLM's other caches" in lines
    assert lines[-2:] == [f"reuse 0.5: {BUSY_JSON['verdict']['text']}",
                          "reuse 0: hits match the plan (0 of 0)"]


def test_header_when_the_server_did_not_say():
    info = RunInfo((URL,), "m", 5, 1, 3, 1, (8, 8), None)
    level = quiet_level()
    level.embeds_per_image = None
    assert printed(info, [level])[1] == ("per level: 1 request of 3 images, concurrency 1; 8x8 "
                                         "png images (unknown embeds each); encoder cache "
                                         "unknown")


def test_a_server_without_the_ttft_split_gets_the_switch_named():
    info = RunInfo((URL,), "m", 5, 6, 1, 2, (32, 24), 16)
    hint = ("time to first token by part: the server splits none (start it with "
            "MMSCOPE_TTFT_PARTS=1 in its environment)")
    assert hint in printed(info, [quiet_level()])
    assert hint not in printed(info, [busy_level(), quiet_level()])
