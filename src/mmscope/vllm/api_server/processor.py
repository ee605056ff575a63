"""API-server wrappers: one range per hashed item and per processor stage (the `mm:*` ranges).

Each times exactly the vLLM call it wraps; the durations feed `vllm:mm_stage_duration_seconds`,
except those of vLLM's warm-up and profile runs, which are no traffic.
"""
from __future__ import annotations

import functools
import threading
import time

from mmscope import stages
from mmscope.emit import tracing
from mmscope.emit.stage_timer import ENABLED, FRONTEND, UNCOUNTED, timed_stage

# hash_kwargs' keyword arguments that are not the item itself
NOT_ITEMS = frozenset({"model_id", "media_io_kwargs", "mm_processor_kwargs", "mm_hash"})


@functools.cache
def _hash_types():
    # Imported on first use: vLLM may still be importing itself when the plugin loads.
    import numpy as np
    import torch
    from PIL import Image
    from vllm.multimodal.media import MediaWithBytes

    return np.ndarray, torch.Tensor, Image.Image, MediaWithBytes


def hash_branch(obj) -> str:
    """The MultiModalHasher.serialize_item branch that serializes `obj` (vLLM 0.32's order). A
    list, tuple or dict is hashed element by element: it is named after its first element, the
    media (a video's `(frames, metadata)` is its frames' ndarray)."""
    if isinstance(obj, (list, tuple)) and obj:
        return hash_branch(obj[0])
    if isinstance(obj, dict) and obj:
        return hash_branch(next(iter(obj.values())))
    branch = _branch_of_type(type(obj))
    if branch is _MEDIA_WITH_BYTES:
        return "image_bytes" if isinstance(obj.media, _hash_types()[2]) else "video"
    return branch


_MEDIA_WITH_BYTES = "media_with_bytes"  # named after its media: an image's bytes or a video


@functools.cache
def _branch_of_type(kind: type) -> str:
    """Every other object's branch follows from its type alone: looked up once per type, for
    an item is hashed on every request."""
    ndarray, tensor, image, media_with_bytes = _hash_types()
    for classes, branch in (((bytes, memoryview), "bytes"), (str, "str"),
                            ((int, float), "number"), (image, "pil_image"),
                            (media_with_bytes, _MEDIA_WITH_BYTES), (tensor, "tensor"),
                            (ndarray, "ndarray")):
        if issubclass(kind, classes):
            return branch
    return "pickle"


def _hash_range(items_kwargs: dict) -> str:
    items = [v for k, v in items_kwargs.items() if k not in NOT_ITEMS]
    return stages.hash_range(hash_branch(items[0]) if len(items) == 1 else "mixed")


class _WarmUp(threading.local):
    """Set on the thread that runs vLLM's warm-up or profile run (docs/design.md §5 "warm-up");
    off on every other thread by the class's default, read on every stage without a getattr's
    missing-attribute path."""

    on = False


_warm_up = _WarmUp()


def dummy_inputs_made(hook, wrapped, processor, args, kwargs):
    """BaseMultiModalProcessor.get_dummy_mm_inputs is where every warm-up and profile run of
    vLLM gets its multimodal inputs (the API server's renderer warm-up, the encoder budget,
    EngineCore's profile run): the hashing and processor stages inside it are timed for no
    request, so they stay out of the stage histogram. Their ranges are still traced."""
    _warm_up.on = True
    try:
        return wrapped(*args, **kwargs)
    finally:
        _warm_up.on = False


def warming_up() -> bool:
    """vLLM's warm-up or profile run is making dummy inputs on this thread."""
    return _warm_up.on


def _collector():
    """Where a stage's duration goes: FRONTEND, or nowhere during a warm-up."""
    return UNCOUNTED if _warm_up.on else FRONTEND


class _HfProcessorTimed:
    """FRONTEND for the HF processor's stage, which also keeps its last duration on this thread:
    what the processor cache's hits spare is priced by it (api_server/processor_cache.py)."""

    clock = FRONTEND.clock

    @staticmethod
    def record(stage: str, duration_ns: int) -> None:
        FRONTEND.record(stage, duration_ns)
        _last_hf.ns = duration_ns


_last_hf = threading.local()


def take_hf_processor_ns() -> int | None:
    """The HF processor's last duration on this thread, once."""
    ns = getattr(_last_hf, "ns", None)
    _last_hf.ns = None
    return ns


def item_hashed(hook, wrapped, cls, args, kwargs, items):
    """MultiModalHasher.hash_kwargs(algorithm, /, **items) consumes serialize_item's lazy byte
    generator before it returns, so a range around the call covers the serialization, not only
    the call."""
    try:
        name = _hash_range(items)
    except Exception as e:  # noqa: BLE001 - ours: the hook turns off, vLLM goes on
        hook.failed(e)
        return wrapped(*args, **kwargs)
    collector = _collector()
    if tracing.on:
        with timed_stage(name, collector):
            return wrapped(*args, **kwargs)
    t0 = time.perf_counter_ns()
    try:
        return wrapped(*args, **kwargs)
    finally:
        if ENABLED:
            collector.record(name, time.perf_counter_ns() - t0)


def processor_stage(hook, wrapped, timing, args, kwargs, stage):
    """TimingContext.record(stage) is entered for every processor stage, vLLM's timing on or off.
    With it off (`enabled` false, the default) vLLM's record() only yields: the stage timer then
    stands in for that no-op block rather than nesting it; with it on, it wraps vLLM's timer."""
    inner = wrapped(*args, **kwargs) if timing.enabled else None
    collector = (UNCOUNTED if _warm_up.on else _HfProcessorTimed if stage == stages.HF_PROCESSOR
                 else FRONTEND)
    return timed_stage(_processor_range(stage), collector, inner)


_processor_range = functools.cache(stages.processor_range)  # five stages a prompt, few names
