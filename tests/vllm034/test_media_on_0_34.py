"""Media before the engine on vLLM 0.34's real OpenAI server: an image from a slow loopback media
server is the `mm:media:fetch` stage and the request's `media` part, the parts add up to vLLM's
TTFT, and 0.34's own render duration holds the media and processor parts."""
from __future__ import annotations

import pytest

from mmscope import stages
from mmscope.load.media_server import MediaServer
from tests.kit import server as ks
from tests.kit.server import png

DELAY_S = 0.3
STAGE, PARTS, RENDER = ("mm_stage_duration_seconds", "request_ttft_part_seconds",
                        "request_render_duration_seconds")
FETCH = stages.media_range("fetch", "http", "image")


@pytest.fixture(scope="module")
def served(tiny_model, tmp_path_factory):
    """One image by URL, then the same bytes under another URL (an encoder and processor cache
    hit that fetches all the same): /metrics before and after, and the second's probe line."""
    from mmscope.demo.serve import VllmServer

    log = str(tmp_path_factory.mktemp("vllm034-media") / "vllm.log")
    env = {"MMSCOPE_TTFT_PARTS": "1", "VLLM_MM_CACHE_PROBE": "1"}
    with MediaServer(latency_s=DELAY_S) as media, VllmServer(tiny_model, log, env=env) as srv:
        part = lambda name: {"type": "image_url", "image_url": {"url": media.add(name, png(5),  # noqa: E731
                                                                                  "image/png")}}
        ks.chat_parts(srv.url, tiny_model, [part("a.png")])
        before = ks.histograms(srv.url, STAGE, PARTS, RENDER)
        rid = ks.chat_parts(srv.url, tiny_model, [part("b.png")])["id"]
        (outcome, split), = ks.probe_lines(srv, {rid}).values()
        after = ks.histograms(srv.url, STAGE, PARTS, RENDER)
    return {k: after.get(k, 0) - before.get(k, 0) for k in after}, outcome, split


def test_the_fetch_stage_and_the_media_part_hold_the_delay(served):
    delta, outcome, split = served
    assert delta[f"{STAGE}_count{{stage={FETCH}}}"] == 1
    assert delta[f"{STAGE}_sum{{stage={FETCH}}}"] >= DELAY_S
    assert outcome == "hit" and split["media"] >= DELAY_S
    assert abs(sum(split[p] for p in stages.TTFT_PARTS) - split["ttft"]) < 1e-3
    assert delta["mm_media_redundant_fetches{modality=image,source=http}"] == 1


def test_vllms_render_duration_holds_the_media_and_processor_parts(served):
    """0.34's vllm:request_render_duration_seconds times its chat render whole: the items'
    media and the processor lie inside it."""
    delta, _, split = served
    render = delta[f"{RENDER}_sum{{request_type=chat}}"]
    assert delta[f"{RENDER}_count{{request_type=chat}}"] == 1
    assert render >= split["media"] + split["processor"]
