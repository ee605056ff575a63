"""vLLM's own OTLP export of its request span, received on loopback: a multimodal request's
`llm_request` span carries its items, their encoder-cache outcomes and its TTFT parts, with child
spans that add up to its time to first token; a text-only request's span is vLLM's alone."""
from __future__ import annotations

import pytest

from mmscope.demo.tiny_llava import IMAGE_TOKENS
from tests.kit import otlp, server as ks

pytestmark = pytest.mark.vllm


def outcomes(image_items=1, misses=0, local=0, computed=0, spared=0) -> dict:
    return {"items.image": image_items, "encoder_cache.misses": misses,
            "encoder_cache.hits.local": local, "encoder_cache.hits.in_step": 0,
            "encoder_cache.hits.connector": 0, "encoder_cache.prefix_covered": 0,
            "encoder_cache.deferrals": 0, "embeddings.computed": computed,
            "embeddings.spared": spared}


@pytest.fixture(scope="module")
def scripted(traced_server, otlp_receiver):
    """A, A, B one at a time (images no other test sends), B answered in one token (its request
    ends in the step that has its first token), then text only; their spans as received."""
    url, model = traced_server.url, traced_server.model
    a, b = 9301, 9302
    ids = [ks.chat(url, model, [a])["id"], ks.chat(url, model, [a])["id"],
           ks.chat(url, model, [b], max_tokens=1)["id"],
           ks.chat_parts(url, model, [], "Just text?")["id"]]
    spans = otlp_receiver.wait_for(lambda got: set(ids) <= set(otlp.request_spans(got)))
    return ids, spans


def test_each_multimodal_span_carries_its_items_and_outcomes(scripted):
    ids, spans = scripted
    by_id = otlp.request_spans(spans)
    miss = outcomes(misses=1, computed=IMAGE_TOKENS)
    assert [otlp.multimodal(by_id[i]) for i in ids] == [
        miss, outcomes(local=1, spared=IMAGE_TOKENS), miss, {}]


def test_child_spans_add_up_to_the_ttft_and_show_the_encoder_of_misses(scripted):
    ids, spans = scripted
    by_id = otlp.request_spans(spans)
    for request_id, missed in zip(ids, (True, False, True)):
        parts = otlp.parts(spans, by_id[request_id])
        assert ("encoder" in parts) == missed, parts
        assert min(parts["media"], parts["render"], parts["processor"], parts["prefill"]) > 0
        assert "ec_load" not in parts


def test_a_text_only_span_is_vllms_own(scripted):
    from vllm.tracing import SpanAttributes

    ids, spans = scripted
    text_only = otlp.request_spans(spans)[ids[-1]]
    vllms = {v for k, v in vars(SpanAttributes).items() if k.isupper()}
    assert set(text_only.attributes) <= vllms
    assert not otlp.children(spans, text_only)
