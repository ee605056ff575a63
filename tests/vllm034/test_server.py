"""mmscope on vLLM 0.34's real OpenAI server (multiprocess: API server, EngineCore and its worker),
with every range, the TTFT split and vLLM's request spans on: each hook of the table that applies
to 0.34 fires once here, and what it feeds is checked as the 0.32 tests state it. The workload is
the issue's: an image, the same image again, a text-only request, another image.
"""
from __future__ import annotations

import re
import time

import pytest

from mmscope import stages
from mmscope.demo.tiny_model import IMAGE_TOKENS
from tests.kit import otlp, traces, vllm034
from tests.kit.item_ways import saved, ways
from tests.kit.server import chat, histograms, metrics

WORKLOAD = [([3401], "What is this?"), ([3401], "And this?"), ([], "Text only"),
            ([3402], "What now?")]
COUNTS = ("encoder_cache_queries", "encoder_cache_hits", "encoder_cache_misses",
          "encoder_cache_query_embeds", "encoder_cache_hit_embeds", "encoder_cache_miss_embeds")


@pytest.fixture(scope="module")
def served(tiny_model, tmp_path_factory):
    """One server, the workload sent once: (server, /metrics before, after, OTLP spans)."""
    from mmscope.demo.serve import VllmServer
    from tests.kit.otlp import Receiver

    base = tmp_path_factory.mktemp("vllm034-server")
    with Receiver() as receiver:
        srv = VllmServer(tiny_model, str(base / "vllm.log"), extra_args=otlp.server_args(receiver),
                         env={"MMSCOPE_TRACE": "chrome", "MMSCOPE_TRACE_DIR": str(base / "traces"),
                              "MMSCOPE_TTFT_PARTS": "1", "VLLM_LOG_STATS_INTERVAL": "1",
                              **otlp.SERVER_ENV})
        srv.trace_dir = base / "traces"
        with srv:
            before = metrics(srv.url)
            for images, text in WORKLOAD:
                chat(srv.url, srv.model, images, text)
            after = settled(srv, before)
            spans = receiver.wait_for(
                lambda s: len([x for x in otlp.request_spans(s).values() if otlp.multimodal(x)])
                >= 3)
            time.sleep(1.5)  # the chrome files are appended to every half second
            yield srv, before, after, spans


def settled(srv, before: dict, timeout_s: float = 30) -> dict:
    """/metrics once it shows the workload's three items, in the encoder cache's queries and by
    their ways (the engine sends at most every second)."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = metrics(srv.url)
        grew = {k: now.get(k, 0) - before.get(k, 0) for k in now}
        items = sum(v for k, v in grew.items() if k.startswith("mm_items{"))
        if min(grew.get("encoder_cache_queries", 0), items) >= 3 or time.monotonic() > deadline:
            time.sleep(1.5)  # one more interval: the histograms come with the counts
            return metrics(srv.url)
        time.sleep(0.3)


def test_a_a_text_b_is_counted_exactly_in_items_and_embeddings(served):
    srv, before, after, _ = served
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in COUNTS}
    assert delta == {"encoder_cache_queries": 3, "encoder_cache_hits": 1,
                     "encoder_cache_misses": 2, "encoder_cache_query_embeds": 3 * IMAGE_TOKENS,
                     "encoder_cache_hit_embeds": IMAGE_TOKENS,
                     "encoder_cache_miss_embeds": 2 * IMAGE_TOKENS}


def test_each_item_counted_once_by_its_way_and_what_the_caches_saved(served):
    """vLLM's processor cache is on by default: the repeat of 3401 hits it first, then the encoder
    cache; the ways add up to vLLM's `mm_cache_*` and mmscope's encoder-cache counters."""
    srv, before, after, _ = served
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    assert ways(delta) == ({"miss": 2, "hit": 1}, {"computed": 2, "cache_hit": 1})
    assert (delta["mm_cache_queries"], delta["mm_cache_hits"]) == (3, 1)
    work = saved(delta)
    assert work["processor_cache"] > 0 and work["encoder_cache"] > 0
    assert work["prefix_cache"] == work["ec_connector"] == 0


def test_every_hook_of_this_release_is_on_and_none_turned_off(served):
    srv, _, after, _ = served
    log = srv.log_text()
    assert "outside the supported range" not in log
    assert "mmscope: cannot hook" not in log, re.findall(r"mmscope: cannot hook \S+", log)
    assert " raised " not in log or "it is now off" not in log
    off = {k: v for k, v in after.items() if k.startswith("mmscope_hook_off{")}
    assert off and set(off.values()) == {0}
    v1_rows = [k for k in off if "hook=ranges.vit_forward," in k]
    assert not v1_rows  # Model Runner V1's rows are not in this release: no series for them
    worker = re.search(r"mmscope: this worker runs Model Runner V2 \(\w+\): (\d+) of its (\d+) "
                       r"hooks applied; the other runner's", log)
    assert worker and worker[1] == worker[2], log[-3000:]


def test_the_runner_line_and_the_hook_series_count_this_runners_rows(served):
    """0.34 has two V2 code bases: the worker counts its own rows and the other's apart, and the
    series of hooks turned off list the rows that can fire here, not the other code base's."""
    from mmscope.vllm import runners, targets
    from mmscope.vllm.patching import in_release

    srv, _, after, _ = served
    mine = runners.V2_STANDALONE if vllm034.current() == vllm034.STANDALONE else runners.V2
    other = runners.V2 if mine == runners.V2_STANDALONE else runners.V2_STANDALONE
    rows = [h for h in targets.TABLE if in_release(h, "0.34.0")]
    own = [h for h in rows if h.runner == mine]
    line = re.search(r"mmscope: this worker runs Model Runner V2 \((\w+)\): (\d+) of its (\d+) "
                     r"hooks applied; the other runner's (\d+) hooks \(([^)]*)\) do not apply here",
                     srv.log_text())
    assert line, srv.log_text()[-3000:]
    assert int(line[4]) == sum(h.runner == other for h in rows) and line[5] == runners.SHORT[other]
    assert len(own) >= int(line[3]) > 0  # the rows that open ranges count only while tracing
    listed = {re.search(r"hook=([^,}]+)", k)[1] for k in after if k.startswith("mmscope_hook_off{")}
    assert listed == {h.name for h in rows if h.runner in (None, mine)}


def test_the_stats_line_carries_the_encoder_hit_rate(served):
    srv = served[0]
    deadline = time.monotonic() + 15
    while "Encoder cache hit rate: " not in srv.log_text() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert re.search(r"Encoder cache hit rate: \d+\.\d%, Encoder work saved: \d+\.\d% of "
                     r"embeddings", srv.log_text())


def test_stage_histograms_hold_the_api_server_and_worker_stages(served):
    srv = served[0]
    counts = {k.split("stage=")[1].rstrip("}"): v
              for k, v in histograms(srv.url, "mm_stage_duration_seconds").items()
              if k.startswith("mm_stage_duration_seconds_count{")}
    assert counts[stages.hash_range("image_bytes")] >= 3  # data URLs keep their bytes
    assert counts[stages.processor_range("apply_hf_processor")] >= 2  # the two new images
    assert counts[stages.VIT_FORWARD] == 2  # two encoder batches, one per new image
    assert counts[stages.GATHER_MM_EMBEDDINGS] >= 2 and counts[stages.EMBED_INPUT_IDS] >= 2


def test_ttft_split_by_part_for_hits_and_misses(served):
    srv = served[0]
    found = histograms(srv.url, "request_mm_time_to_first_token_seconds")
    n = {o: found.get(f"request_mm_time_to_first_token_seconds_count{{encoder_cache={o}}}", 0)
         for o in ("hit", "miss")}
    assert n == {"hit": 1, "miss": 2}


def test_the_request_span_carries_items_outcomes_and_ttft_parts(served):
    spans = served[3]
    mm = {rid: s for rid, s in otlp.request_spans(spans).items() if otlp.multimodal(s)}
    facts = sorted((otlp.multimodal(s)["encoder_cache.misses"],
                    otlp.multimodal(s)["encoder_cache.hits.local"]) for s in mm.values())
    assert facts == [(0, 1), (1, 0), (1, 0)]
    for span in mm.values():
        assert otlp.multimodal(span)["items.image"] == 1
        parts = otlp.parts(spans, span)  # child spans end to end, adding up to the TTFT
        missed = otlp.multimodal(span)["encoder_cache.misses"] == 1
        assert ("encoder" in parts) == missed, parts
        assert min(parts[p] for p in (*stages.TTFT_API_PARTS, stages.TTFT_PREFILL)) > 0, parts


def test_the_servers_trace_holds_the_stage_tree_and_passes_every_check(served):
    """The worker's step ranges (opened at V2's calls), the stages under preprocess and
    step_meta, read by `mmscope analyze` from the chrome traces of every process."""
    names = traces.analyzed_stages(served[0].trace_dir)
    assert {stages.PREPROCESS, stages.FORWARD, stages.VIT_FORWARD, stages.GATHER_MM_EMBEDDINGS,
            stages.EMBED_INPUT_IDS, stages.hash_range("image_bytes")} <= names, names
