"""Accounting under pressure: encoder budget deferrals, chunked prefill and preemption must not
double count; misses equal the images the encoder really computed."""
from __future__ import annotations

import pytest

from tests.kit.engine import EncoderWork, counters, image, offline_llm, prompt

pytestmark = [pytest.mark.vllm, pytest.mark.runners]

BLOCK_BYTES = 128 * 512  # CPU block of 128 tokens x 512 B/token (2 layers, K+V, 1 head of 32 fp32)


@pytest.fixture(scope="module")
def tight(tiny_model):
    # Token budget 32 = encoder budget = encoder cache (16-embed images: two fit);
    # three KV blocks for three requests needing two each: someone is preempted; no prefix
    # caching, so a resumed request runs its images through the encoder cache again.
    work = EncoderWork()  # before the engine: a V2 runner wraps the model's method as it loads
    llm = offline_llm(tiny_model, max_num_batched_tokens=32, max_model_len=256,
                      kv_cache_memory_bytes=3 * BLOCK_BYTES, enable_prefix_caching=False)
    work.reset()
    yield llm, work
    work.close()


def test_deferral_chunking_preemption_counted_exactly(tight):
    from vllm import SamplingParams

    llm, work = tight
    prompts = [prompt([image(200 + 2 * i), image(201 + 2 * i)], "") for i in range(3)]
    llm.generate(prompts, SamplingParams(max_tokens=150, ignore_eos=True), use_tqdm=False)
    c = counters(llm)
    preemptions = int(c["num_preemptions"])
    assert preemptions == 1
    # Six distinct images, each computed once: a miss is an encoder run, not a deferral.
    assert work.items == 6
    assert c["encoder_cache_misses"] == 6
    # Request 1's second image did not fit the encoder cache beside request 0's: deferred once.
    assert c["encoder_cache_deferrals"] == 1
    # Chunks that revisit an image add nothing; the preempted request's two images are
    # committed again when it resumes (still resident: local hits).
    assert c["encoder_cache_queries"] == 6 + 2 * preemptions
    assert c["encoder_cache_hits"] == c["encoder_cache_hits_by_source{source=local}"] == 2
    assert c["encoder_cache_evictions"] == 4
    assert c["encoder_cache_capacity_embeds"] == 32
    # In embeddings (16 an image): the misses are the rows the encoder computed, deferrals and
    # revisiting chunks weigh nothing, the resumed request's two hits weigh their images.
    assert c["encoder_cache_miss_embeds"] == work.rows == 6 * 16
    assert c["encoder_cache_hit_embeds"] == c["encoder_cache_hit_embeds_by_source{source=local}"] \
        == 2 * 16
    assert c["encoder_cache_query_embeds"] == (6 + 2 * preemptions) * 16
    assert c["encoder_cache_capacity_bytes"] == 32 * work.nbytes // work.rows
