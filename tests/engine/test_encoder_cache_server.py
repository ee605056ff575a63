"""Accounting through the real OpenAI server (multiprocess: EngineCore -> API server transport),
with only the plugin installed: /metrics counters, the stats log line, no probe lines by default."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from mmscope.demo.serve import VllmServer
from tests.kit.server import chat, metrics

pytestmark = pytest.mark.vllm

KEYS = ("encoder_cache_queries", "encoder_cache_hits", "encoder_cache_misses")


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "vllm.log"
    # Stats line every second instead of every ten, so the test sees it quickly.
    with VllmServer(tiny_model, str(log), env={"VLLM_LOG_STATS_INTERVAL": "1"}) as srv:
        yield srv


def delta(server, fn):
    before = metrics(server.url)
    fn()
    after = metrics(server.url)
    return tuple(int(after.get(k, 0) - before.get(k, 0)) for k in KEYS), after


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


def test_stats_line_shows_encoder_hit_rate_and_no_probe_by_default(server):
    chat(server.url, server.model, [1], "Once more")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "Encoder cache hit rate" not in server.log_text():
        time.sleep(0.5)
    lines = [ln for ln in server.log_text().splitlines() if "Encoder cache hit rate" in ln]
    assert lines, "the periodic stats line never carried the encoder hit rate"
    assert "Avg prompt throughput" in lines[-1] and lines[-1].rstrip().endswith("%")
    assert "mm_cache_probe" not in server.log_text()
    assert "Unknown vLLM environment variable detected: VLLM_MM_CACHE_PROBE" not in server.log_text()
