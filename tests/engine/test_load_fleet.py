"""`mmscope load` over a fleet of two real OpenAI servers on the tiny model, scraped by a real
Prometheus: one plan over two --url (each instance's share), two shards at once each to its own
instance with the counters from Prometheus, and a round-robin router in front of both, whose
observed hits lie within the verdict's router bounds and equal the hits its routing gives."""
from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from mmscope.load import plan
from mmscope.load.observed import series
from mmscope.load.fleet import Shard
from tests.kit.prometheus import JOB, Prometheus
from tests.kit.router import RoundRobin

pytestmark = pytest.mark.vllm

TINY = ["--image-size", "32x32"]  # the tiny model's own size: 16 embeddings per image
RUN_TIMEOUT_S = 180


def load(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mmscope.load.command", "--json", *TINY, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(*runs: subprocess.Popen) -> list[dict]:
    outs = [run.communicate(timeout=RUN_TIMEOUT_S) for run in runs]
    assert [run.returncode for run in runs] == [0] * len(runs), [err for _, err in outs]
    return [json.loads(out) for out, _ in outs]


@pytest.fixture(scope="module")
def fleet(tiny_model, tmp_path_factory):
    """Two servers, started together, and a Prometheus scraping both every second."""
    from mmscope.demo.serve import VllmServer

    base = tmp_path_factory.mktemp("fleet")
    servers = [VllmServer(tiny_model, str(base / f"vllm-{n}.log")) for n in range(2)]
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda server: server.start(), servers))
        targets = [f"127.0.0.1:{server.port}" for server in servers]
        with Prometheus(targets, str(base)) as prom:
            for target in targets:
                prom.wait_for_scrape_after(
                    f'{series.exposed(series.QUERIES)}{{instance="{target}"}}', 0)
            yield servers, prom
    finally:
        for server in servers:
            server.stop()


def instance(server) -> str:
    return f"127.0.0.1:{server.port}"


def test_two_urls_share_one_plan_and_each_instance_shows_its_share(fleet):
    (a, b), _ = fleet
    out, = finished(load("--url", a.url, "--url", b.url, "--reuse", "0,0.5", "--requests", "16",
                         "--concurrency", "4", "--seed", "501"))
    assert out["ok"] is True and out["shard"]["lanes"] == 2
    whole = plan.build(501, [0, 0.5], 16, 1, (32, 32), lanes=2)
    for level, planned in zip(out["levels"], whole.levels):
        assert level["verdict"]["status"] == "match" and level["router"] is None
        assert level["observed_hits"] == level["planned_hits"] == planned.planned_hits
        for server, part in zip((a, b), Shard(0).spread(planned, 2)):
            share = level["instances"][server.url]
            # vLLM's own request count and time to first token, mmscope's counts
            assert (share["requests"], share["queries"], share["hits"], share["misses"]) == \
                (len(part.requests), part.images, part.planned_hits, part.distinct)
            assert share["planned_hits"] == part.planned_hits and share["evictions"] == 0
            assert share["ttft_ms"]["mean_ms"] > 0 and share["capacity_embeds"] == 2048
        assert level["capacity_embeds"] == 4096


def test_two_shards_at_once_each_to_its_own_instance_read_from_prometheus(fleet):
    (a, b), prom = fleet
    runs = [load("--url", server.url, "--shard", f"{k}/2", "--prometheus", prom.url,
                 "--prometheus-match", f'{{job="{JOB}",instance="{instance(server)}"}}',
                 "--reuse", "0.5,0.9", "--requests", "16", "--concurrency", "2", "--seed", "502")
            for k, server in ((1, a), (2, b))]
    shards = finished(*runs)
    whole = plan.build(502, [0.5, 0.9], 16, 1, (32, 32), lanes=2)
    for n, planned in enumerate(whole.levels):
        levels = [shard["levels"][n] for shard in shards]
        for level, server in zip(levels, (a, b)):
            assert level["verdict"]["status"] == "match", level["verdict"]
            assert list(level["instances"]) == [instance(server)]
            assert level["instances"][instance(server)]["queries"] == level["images"]
        # together, the whole plan
        assert sum(lv["requests"] for lv in levels) == 16
        assert sum(lv["planned_hits"] for lv in levels) == planned.planned_hits
        assert sum(lv["observed_queries"] for lv in levels) == planned.images
    assert all(shard["counters"].startswith(f"Prometheus {prom.url} ") for shard in shards)


def routed_hits(chats: list[tuple[str, dict]], level: int, seed: int) -> dict[str, int]:
    """Per upstream, the level's hits its routing gives: images an instance was sent before."""
    held: dict[str, set[str]] = {}
    hits: dict[str, int] = {}
    for upstream, body in chats:
        parts = body["messages"][0]["content"]
        images = [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]
        text = " ".join(p["text"] for p in parts if p["type"] == "text")
        seen = held.setdefault(upstream, set())
        if f"of level {level} (seed {seed})" in text:
            hits[upstream] = hits.get(upstream, 0) + sum(i in seen for i in images)
        seen.update(images)
    return hits


def test_a_round_robin_router_in_front_of_both(fleet):
    (a, b), prom = fleet
    with RoundRobin([a.url, b.url]) as router:
        out, = finished(load("--url", router.url, "--prometheus", prom.url,
                             "--prometheus-match", f'{{job="{JOB}"}}', "--reuse", "0.5,0.9",
                             "--requests", "16", "--concurrency", "1", "--seed", "503"))
    assert out["ok"] is True
    for n, level in enumerate(out["levels"]):
        bounds = level["router"]
        assert bounds["instances"] == 2 and bounds["affine_hits"] == level["planned_hits"]
        assert bounds["fewest_hits"] <= level["observed_hits"] <= bounds["affine_hits"]
        assert level["verdict"]["status"] in ("match", "routed")
        assert "an image-affine router gives" in level["verdict"]["text"]
        # one request at a time, the hits are exactly those of the router's routing
        hits = routed_hits(router.chats, n, 503)
        assert level["observed_hits"] == sum(hits.values())
        for server in (a, b):
            assert level["instances"][instance(server)]["hits"] == hits.get(server.url, 0)
    assert any(lv["observed_hits"] < lv["planned_hits"] for lv in out["levels"])
