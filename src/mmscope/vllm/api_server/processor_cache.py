"""API-server wrappers of vLLM's processor cache (`--mm-processor-cache-gb`): what it did for each
item of a prompt, by the item's hash, and what the HF processor costs per item it runs for, for
each item's way through the cache layers (docs/design.md §4b).
"""
from __future__ import annotations

import threading

from mmscope.carry import item_ways
from mmscope.vllm.api_server.processor import take_hf_processor_ns, warming_up

WAYS = item_ways.ProcessorWays()  # the cache's answers by hash, until their items' engine outcome
HF_COSTS = item_ways.ProcessorCosts()  # the HF processor's time per item, by modality
# Set on vLLM's processor thread while it processes a prompt for no engine request
_skipping = threading.local()


def prompt_processed(hook, wrapped, renderer, args, kwargs, skip_mm_cache):
    """BaseRenderer._process_multimodal: a prompt's items processed. With skip_mm_cache (vLLM's
    tokenize and render endpoints) its processor-only cache answers: vLLM's cache statistics
    leave those out, and their items reach no engine here."""
    if not skip_mm_cache:
        return wrapped(*args, **kwargs)
    _skipping.on = True
    try:
        return wrapped(*args, **kwargs)
    finally:
        _skipping.on = False


def cache_merged(hook, wrapped, processor, args, kwargs, cache, mm_hashes, mm_is_cached):
    """BaseMultiModalProcessor._merge_mm_kwargs(cache, mm_hashes, mm_is_cached): each item of
    the prompt got from the processor cache or added to it, after the lookup (`mm_is_cached`,
    vLLM's answer) and the HF processor's run for the items it did not hold."""
    result = wrapped(*args, **kwargs)
    if warming_up() or getattr(_skipping, "on", False):
        return result
    try:
        WAYS.looked_up(item_ways.prompt_hits(mm_hashes, mm_is_cached, cache.is_cached_item))
        hf_ns = take_hf_processor_ns()
        if hf_ns is not None:  # the items it ran for: those the lookup did not find
            HF_COSTS.processed({m: flags.count(False) for m, flags in mm_is_cached.items()},
                               hf_ns)
    except Exception as e:  # noqa: BLE001 - ours: the hook turns off, vLLM goes on
        hook.failed(e)
    return result
