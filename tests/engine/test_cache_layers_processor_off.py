"""Each item's way with vLLM's processor cache off (`--mm-processor-cache-gb 0`): vLLM looks no
item up, so every item's processor way is `off`; where its embeddings came from is counted as with
the cache on, and only the encoder's layers saved work."""
from __future__ import annotations

import pytest

from tests.kit.item_ways import CHATS, agree_with_the_counters, reading, saved, settled, ways
from tests.kit.server import chat

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    from mmscope.demo.serve import VllmServer

    base = tmp_path_factory.mktemp("processor-cache-off")
    with VllmServer(tiny_model, str(base / "vllm.log"),
                    extra_args=["--mm-processor-cache-gb", "0"]) as srv:
        yield srv


def test_chats_a_a_b_a_ab_with_the_processor_cache_off(server):
    before = reading(server.url)
    for images, text in CHATS:
        chat(server.url, server.model, images, text)
    delta = settled(server.url, before, 6)
    assert ways(delta) == ({"off": 6}, {"computed": 2, "cache_hit": 4})
    agree_with_the_counters(delta, processor_cache=False)
    work = saved(delta)
    assert work["encoder_cache"] > 0
    assert work["processor_cache"] == work["prefix_cache"] == work["ec_connector"] == 0
