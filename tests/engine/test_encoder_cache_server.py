"""Accounting through the real OpenAI server that the README's quick start starts (multiprocess:
EngineCore -> API server transport), with only the plugin installed: the quick start's request
and the output it shows, /metrics counters, the stats log line, no warm-up in the stage
histograms, no probe lines by default."""
from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from mmscope import stages
from tests.kit import readme
from tests.kit.server import chat, histograms, metrics

pytestmark = pytest.mark.vllm

KEYS = ("encoder_cache_queries", "encoder_cache_hits", "encoder_cache_misses")
STAGE_HISTOGRAM = "mm_stage_duration_seconds"


def stage_counts(url: str) -> dict[str, float]:
    prefix = STAGE_HISTOGRAM + "_count{stage="
    return {k[len(prefix):-1]: v for k, v in histograms(url, STAGE_HISTOGRAM).items()
            if k.startswith(prefix)}


@pytest.fixture(scope="module")
def quick_start(tiny_model, tmp_path_factory):
    """The README's quick-start server; its stage histograms read before any request. Stats
    line every second instead of every ten, so the tests see it quickly."""
    section = readme.Section("quick-start", tiny_model, tmp_path_factory.mktemp("quick-start"),
                             env={"VLLM_LOG_STATS_INTERVAL": "1"})
    with section:
        server = section.serve()
        section.stages_at_start = stage_counts(server.url)
        yield section


@pytest.fixture(scope="module")
def server(quick_start):
    return quick_start.server


def delta(server, fn):
    before = metrics(server.url)
    fn()
    after = metrics(server.url)
    return tuple(int(after.get(k, 0) - before.get(k, 0)) for k in KEYS), after


def test_the_quick_start_request_as_written_and_no_warm_up_in_the_stage_histograms(quick_start):
    """The first traffic: vLLM's warm-up and profile runs before it hashed and processed dummy
    images (PIL images, three of each stage) for no request; only the two real requests count."""
    assert quick_start.stages_at_start, "the stage histogram exists from the start"
    assert set(quick_start.stages_at_start.values()) == {0}
    # doctor, the requests, /metrics, the cache's size: as the README shows them
    outputs = quick_start.run_rest()
    assert [block.lang for block, _ in outputs] == ["bash", "python", "bash", "bash"]
    assert "vLLM 0.32.0: tested" in outputs[0][1]  # doctor, on the installed vLLM
    counts = stage_counts(quick_start.server.url)
    assert counts[stages.hash_range("image_bytes")] == 2  # the data URL, twice
    assert counts[stages.hash_range("pil_image")] == 0
    assert counts[stages.processor_range("apply_hf_processor")] == 2


def test_counters_exist_with_native_labels(server):
    import httpx

    text = httpx.get(server.url + "/metrics").text
    for name in ("vllm:encoder_cache_queries_total", "vllm:encoder_cache_hits_total"):
        line = next(ln for ln in text.splitlines() if ln.startswith(name + "{"))
        assert f'model_name="{server.model}"' in line and 'engine="0"' in line
    assert "# HELP vllm:encoder_cache_queries_total Encoder cache queries" in text


def test_scripted_sequence_exact_counts(server):
    m = server.model
    d, _ = delta(server, lambda: chat(server.url, m, [1]))
    assert d == (1, 0, 1)
    d, _ = delta(server, lambda: chat(server.url, m, [1], "And now?"))
    assert d == (1, 1, 0)
    d, _ = delta(server, lambda: chat(server.url, m, [2, 2, 1], "Three?"))
    assert d == (3, 2, 1)
    d, _ = delta(server, lambda: chat(server.url, m, [], "Just text"))
    assert d == (0, 0, 0)


def test_concurrent_requests_share_a_new_image(server):
    m = server.model

    def two():
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda t: chat(server.url, m, [7], t), ["One?", "Two?"]))

    d, after = delta(server, two)
    assert d == (2, 1, 1)
    assert after["encoder_cache_queries"] == after["encoder_cache_hits"] + after["encoder_cache_misses"]


def stats_lines(server, needle: str) -> list[str]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and needle not in server.log_text():
        time.sleep(0.5)
    return [ln for ln in server.log_text().splitlines() if needle in ln]


def test_stats_line_shows_encoder_hit_rate_and_no_probe_by_default(server):
    chat(server.url, server.model, [1], "Once more")
    lines = stats_lines(server, "Encoder cache hit rate")
    assert lines, "the periodic stats line never carried the encoder hit rate"
    assert "Avg prompt throughput" in lines[-1]
    assert re.search(r"Encoder cache hit rate: [\d.]+%, Encoder work saved: [\d.]+% of embeddings",
                     lines[-1]), lines[-1]
    assert "mm_cache_probe" not in server.log_text()
    assert "Unknown vLLM environment variable detected: VLLM_MM_CACHE_PROBE" not in server.log_text()


def test_stats_line_shows_the_encoder_work_the_prefix_cache_spared(server):
    # The image first, then three 128-token blocks of text: each repeat finds the image's
    # placeholders in prefix-cached blocks, and vLLM never looks the item up.
    long = "Describe this picture in great detail, please. " * 40
    before = metrics(server.url)
    for _ in range(3):
        chat(server.url, server.model, [60], long)
    after = metrics(server.url)
    assert after["encoder_cache_prefix_covered"] - before.get("encoder_cache_prefix_covered", 0) == 2
    lines = stats_lines(server, "Encoder work avoided")
    assert lines, "the stats line never said how much encoder work the prefix cache spared"
    assert re.search(r"Encoder work avoided: \d+\.\d% of items(, |$)", lines[-1].rstrip())
