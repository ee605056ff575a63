"""`mmscope load` against the real OpenAI server on the tiny model (loopback only): exact counts
when the encoder cache holds a level, a capacity-explained shortfall when it cannot, and one-line
errors for a wrong model and a request vLLM refuses (stand-in servers: tests/unit/test_load_*)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mmscope.demo.serve import VllmServer
from tests.kit.cli import one_line_error

pytestmark = pytest.mark.vllm

TINY = ["--image-size", "32x32"]  # the tiny model's own size: 16 embeddings per image
RUN_TIMEOUT_S = 120


def load(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mmscope.load.command", "--url", url, *args],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def load_json(url: str, *args: str) -> dict:
    done = load(url, "--json", *args)
    assert done.returncode == 0, done.stderr
    # The progress bar stays off a pipe; stdout is pure JSON.
    assert all(ln.startswith("wrote ") for ln in done.stderr.splitlines()), done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def small_cache_server(tiny_model, tmp_path_factory):
    """Token budget 64 = encoder cache of 64 embeddings: four tiny-model images."""
    log = tmp_path_factory.mktemp("small-cache") / "vllm.log"
    with VllmServer(tiny_model, str(log), extra_args=["--max-num-batched-tokens", "64"]) as srv:
        yield srv


def test_counts_equal_the_plan_when_the_cache_holds_a_level(traced_server, tmp_path):
    plot = tmp_path / "sweep.png"
    out = load_json(traced_server.url, *TINY, "--reuse", "0,0.5,0.9", "--requests", "20",
                    "--images-per-request", "2", "--concurrency", "4", "--seed", "101",
                    "--plot", str(plot))
    assert out["model"] == traced_server.model and out["ok"] is True
    assert out["embeds_per_image"] == 16
    assert [lv["planned_hits"] for lv in out["levels"]] == [0, 20, 36]
    for level in out["levels"]:
        assert level["distinct_images"] * 16 <= level["capacity_embeds"] == 2048
        assert level["observed_queries"] == level["images"] == 40
        assert level["observed_hits"] == level["planned_hits"]
        assert level["observed_misses"] == level["distinct_images"]
        # in embeddings: every image weighs its 16
        assert (level["observed_query_embeds"], level["observed_hit_embeds"]) == (
            16 * level["observed_queries"], 16 * level["observed_hits"])
        assert level["observed_embed_hit_rate"] == level["observed_hit_rate"]
        assert sum(level["hits_by_source"].values()) == level["observed_hits"]
        assert level["capacity_allows_hits"] == level["planned_hits"]
        assert level["verdict"]["status"] == "match"
        # Unique prompts: no prefix-cache hit could hide an encoder lookup.
        assert level["prefix_cache"]["hits"] == 0
        assert level["mm_cache"]["queries"] == 40
        # Each cache layer as planned: the repeats hit the processor cache first, then the
        # encoder cache; the distinct images miss and are computed; hits saved measured time.
        layers = level["layers"]
        assert layers["planned"] == {
            "processor": {"hit": level["planned_hits"], "miss": level["distinct_images"],
                          "off": 0}, "spared": level["planned_hits"],
            "computed": level["distinct_images"]}
        seen = layers["observed"]
        assert seen["processor"] == layers["planned"]["processor"]
        assert seen["processor"]["hit"] == level["mm_cache"]["hits"]
        assert seen["encoder"] == {"cache_hit": level["planned_hits"], "prefix_covered": 0,
                                   "ec_loaded": 0, "computed": level["distinct_images"]}
        if level["planned_hits"]:
            assert seen["saved_s"]["processor_cache"] > 0 and seen["saved_s"]["encoder_cache"] > 0
        # Each request's TTFT split: a hit is a request whose images all repeat (the cache
        # holds the level); a hit's encoder share is 0; the client waits beyond the server (wall time:
        # how much more is printed, not asserted).
        split = level["ttft_parts"]
        assert (split["hit"]["requests"], split["miss"]["requests"]) == \
            (level["repeat_requests"], 20 - level["repeat_requests"])
        assert split["miss"]["parts"]["encoder"]["mean_ms"] > 0
        assert split["hit"]["requests"] == 0 or split["hit"]["parts"]["encoder"]["mean_ms"] == 0
        assert split["client_beyond_server_mean_ms"] >= 0
    ttft = out["levels"][2]["ttft_ms"]
    assert all(ttft[k] > 0 for k in ("repeat_p50", "repeat_p90", "new_p50", "new_p90"))
    assert out["levels"][0]["ttft_ms"]["repeat_p50"] is None  # reuse 0: nothing repeats
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_table_and_a_rerun_with_the_same_seed(traced_server):
    args = (*TINY, "--reuse", "0", "--requests", "6", "--seed", "202")
    first = load(traced_server.url, *args)
    assert first.returncode == 0, first.stderr
    assert "encoder cache per reuse level" in first.stdout
    assert "reuse 0: hits match the plan (0 of 0)" in first.stdout
    assert "encoder cache 2048 embeds" in first.stdout
    # The server still holds the first run's images: more hits than planned, said so.
    again = load_json(traced_server.url, *args)
    level = again["levels"][0]
    assert level["observed_hits"] == 6 and level["verdict"]["status"] == "excess"
    assert "earlier run with the same --seed" in level["verdict"]["text"]


def test_small_cache_shortfall_explained_by_capacity(small_cache_server):
    out = load_json(small_cache_server.url, *TINY, "--reuse", "0.5", "--requests", "40",
                    "--concurrency", "1", "--seed", "303")
    level = out["levels"][0]
    assert level["capacity_embeds"] == 64 and level["distinct_images"] == 20
    assert level["observed_queries"] == level["images"] == 40
    shortfall = level["planned_hits"] - level["observed_hits"]
    assert 0 < shortfall <= level["evictions"]
    # One request at a time, vLLM's eviction order is exactly the LRU the estimate replays.
    assert level["observed_hits"] == level["capacity_allows_hits"]
    assert level["verdict"]["status"] == "explained" and out["ok"] is True
    assert "shortfall explained by capacity (" in level["verdict"]["text"]
    assert "capacity 64 embeds" in level["verdict"]["text"]
    # per layer: the processor cache (4 GiB) held every repeat the encoder cache lost
    seen = level["layers"]["observed"]
    assert seen["processor"]["hit"] == level["planned_hits"]
    assert seen["encoder"]["computed"] == level["observed_misses"] > level["distinct_images"]
    assert (f"layers: the encoder computed {level['observed_misses']} items for 20 distinct "
            "images") in level["verdict"]["text"]


def test_small_cache_table_verdict_under_concurrency(small_cache_server):
    done = load(small_cache_server.url, *TINY, "--reuse", "0.5", "--requests", "30",
                "--concurrency", "3", "--seed", "304")
    assert done.returncode == 0, done.stdout + done.stderr
    verdict = [ln for ln in done.stdout.splitlines() if ln.startswith("reuse 0.5:")]
    assert verdict and "shortfall explained by capacity" in verdict[0]


def test_wrong_model_name(traced_server):
    message = one_line_error(load(traced_server.url, *TINY, "--model", "no-such-model"))
    assert message == (f"mmscope: error: model 'no-such-model' is not served at "
                       f"{traced_server.url} (it serves: {traced_server.model})")


def test_server_error_reaches_the_user(traced_server):
    # More tokens than the model's length: vLLM answers 400 to the first (probe) request.
    message = one_line_error(load(traced_server.url, *TINY, "--max-tokens", "5000"))
    assert message.startswith("mmscope: error: probe request without an image: HTTP 400: ")


def test_the_prefix_plan_shows_the_encoder_work_the_prefix_cache_spares(traced_server):
    # Whole requests repeated, images first and 120 words after them: with vLLM's prefix caching
    # (on by default) each repeat finds its images in cached blocks and never looks them up.
    out = load_json(traced_server.url, *TINY, "--prefix", "--reuse", "0.5", "--requests", "8",
                    "--concurrency", "1", "--seed", "404")  # images no other test sent
    level = out["levels"][0]
    assert out["prefix_plan"] is True and out["ok"] is True
    assert level["planned_hits"] == 4
    assert level["observed_prefix_covered"] == 4 and level["observed_hits"] == 0, level
    assert level["observed_queries"] == level["observed_misses"] == level["distinct_images"] == 4
    assert level["observed_avoided_rate"] == 0.5
    assert level["verdict"]["text"] == "hits match the plan (4 of 4) (0 hits, 4 prefix-covered)"
    seen = level["layers"]["observed"]  # the repeats: processor-cache hits, prefix-covered
    assert seen["processor"] == {"hit": 4, "miss": 4, "off": 0}
    assert seen["encoder"] == {"cache_hit": 0, "prefix_covered": 4, "ec_loaded": 0, "computed": 4}
    assert seen["saved_s"]["prefix_cache"] > 0 and seen["saved_s"]["encoder_cache"] == 0


def test_images_by_http_url_show_their_fetch_and_the_ttft_it_cost(traced_server):
    """`--media data_url,http --media-latency 200ms`: requests take turns; the http ones wait for
    the media server, so their fetch (by source, from the server's stage histogram) holds the
    latency and so does their TTFT; the fetches and bytes match the plan, and the repeats' fetches
    are the ones the processor cache made pointless."""
    out = load_json(traced_server.url, *TINY, "--reuse", "0.5", "--requests", "8",
                    "--concurrency", "2", "--seed", "103", "--media", "data_url,http",
                    "--media-latency", "200ms")
    (level,) = out["levels"]
    assert out["media"]["sources"] == ["data_url", "http"] and out["media"]["latency_ms"] == 200
    assert level["verdict"]["status"] == "match"
    http, data = level["media"]["by_source"]["http"], level["media"]["by_source"]["data_url"]
    assert (http["requests"], http["items"], data["requests"], data["items"]) == (4, 4, 4, 4)
    assert http["fetch_ms"]["mean"] >= 200 > data["fetch_ms"]["mean"]
    # The fetch's 200 ms lies in each http request's TTFT; what the rest takes depends on the
    # machine's load, so the data URLs' TTFT is compared with the http ones', not with 200 ms.
    assert http["ttft_ms"]["p50"] >= 200 and http["ttft_ms"]["p50"] > data["ttft_ms"]["p50"]
    f = level["media"]["fetches"]
    assert f["planned"] == f["served"] == f["counted"] == 4
    assert f["planned_bytes"] == f["served_bytes"] == f["counted_bytes"] == http["bytes"] > 0
    assert "fetches match the plan (4 fetches" in level["verdict"]["text"]
    # every repeat's content was in the processor cache when it was fetched again
    redundant = http["redundant_fetches"] + data["redundant_fetches"]
    assert redundant == level["planned_hits"] == 4
    assert level["ttft_parts"]["miss"]["parts"]["media"]["mean_ms"] > 0
