"""Two engines behind one OpenAI server (vLLM's data parallelism on CPU, --data-parallel-size 2):
each engine's series carry its `engine` label and its counts are exactly what that engine did,
as its own probe lines (logged from its EngineCore_DP<i> process) show item by item."""
from __future__ import annotations

import re
import time

import pytest

from mmscope.demo.serve import VllmServer
from tests.kit.server import chat, metrics

pytestmark = pytest.mark.vllm

PROBE = re.compile(r"\(EngineCore_DP(\d) pid=\d+\).*mm_cache_probe (HIT|MISS) ")


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("dp") / "vllm.log"
    srv = VllmServer(tiny_model, str(log), extra_args=["--data-parallel-size", "2"],
                     env={"VLLM_MM_CACHE_PROBE": "1"})
    srv.start(timeout_s=900)  # two EngineCores start one after the other on 2 cores
    try:
        before = metrics(srv.url)
        for seeds in ([1], [2], [3], [1], [2], [4, 4], [3]):
            chat(srv.url, srv.model, seeds)
        time.sleep(2.5)  # the counters travel at most a second apart while busy
        yield srv, before, metrics_by_engine(srv.url)
    finally:
        srv.stop()


def metrics_by_engine(url: str) -> dict[str, dict[str, float]]:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text):
        if not family.name.startswith("vllm:encoder_cache"):
            continue
        for s in family.samples:
            if s.name.endswith("_total") and "engine" in s.labels:
                key = s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items())
                                       if k not in ("engine", "model_name"))
                out.setdefault(s.labels["engine"], {})[key] = s.value
    return out


def test_every_series_exists_for_both_engines_from_the_start(server):
    _, before, _ = server
    # read before any request: both engines' zero series (sources too) were already there
    assert before["encoder_cache_queries"] == 0
    srv = server[0]
    text = __import__("httpx").get(srv.url + "/metrics").text
    for engine in ("0", "1"):
        assert f'vllm:encoder_cache_hits_by_source_total{{engine="{engine}"' in text


def test_each_engines_counts_are_what_its_own_process_committed(server):
    srv, _, by_engine = server
    probes: dict[tuple[str, str], int] = {}
    for m in PROBE.finditer(srv.log_text()):
        probes[(m.group(1), m.group(2))] = probes.get((m.group(1), m.group(2)), 0) + 1
    total_queries = 0
    for engine in ("0", "1"):
        counts = by_engine[engine]
        hits = counts["vllm:encoder_cache_hits_total"]
        misses = counts["vllm:encoder_cache_misses_total"]
        assert counts["vllm:encoder_cache_queries_total"] == hits + misses
        assert hits == probes.get((engine, "HIT"), 0)
        assert misses == probes.get((engine, "MISS"), 0)
        total_queries += hits + misses
    assert total_queries == 8  # every item sent, each committed on exactly one engine
    # four distinct images: at least four misses; repeats hit only where they met their image
    assert sum(by_engine[e]["vllm:encoder_cache_misses_total"] for e in "01") >= 4
    # the request with one image twice: its second copy is an in-step hit on its engine
    assert sum(by_engine[e]["vllm:encoder_cache_hits_by_source_total{source=in_step}"]
               for e in "01") == 1
