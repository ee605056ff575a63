"""The worker-side EC connector's load and save: timed as stages (docs/design.md §3) and counted as
transfers (carry/transfers.py), which ride to EngineCore like the stage durations.
"""
from __future__ import annotations

import itertools
import time

from mmscope import stages
from mmscope.carry.transfers import LOAD, SAVE, TRANSFERS
from mmscope.emit import tracing
from mmscope.emit.stage_timer import ENABLED, WORKER

# The parameters of the connector's methods the wrappers receive, bound by name.
LOAD_PARAMS = ("encoder_cache",)
SAVE_PARAMS = ("encoder_cache", "mm_hash")


def _transfer(stage: str, direction: str, call):
    """A wrapper that runs `call(wrapped, args, kwargs, *params) -> (result, moved)` as one timed
    stage (a span too while tracing) and counts what it moved; a call that moved nothing is a
    stage sample only, so that seconds per item is the cost of a transfer. The stage sample is
    read from the worker's clock (device time on an accelerator); a transfer's seconds are the
    call's host wall time, which holds the connector's file or network I/O."""
    def _timed(hook, wrapped, instance, args, kwargs, *params):
        started = WORKER.clock.start() if ENABLED else None
        t0 = time.perf_counter_ns()
        result, moved = call(hook, wrapped, args, kwargs, *params)
        elapsed = time.perf_counter_ns() - t0
        try:
            if ENABLED:
                WORKER.clock.stop(WORKER, stage, started)
            items, nbytes = moved()
            if items:
                TRANSFERS.moved(direction, items, nbytes, elapsed)
        except Exception as e:  # noqa: BLE001 - ours: the hook turns off, vLLM goes on
            hook.failed(e)
        return result
    return tracing.spanned(stage, _timed)


def _load(hook, wrapped, args, kwargs, encoder_cache):
    """start_load_caches(encoder_cache) adds the loaded mm_hashes to the dict, which keeps
    insertion order: the new entries are its last ones."""
    try:
        before = len(encoder_cache)
    except Exception as e:  # noqa: BLE001
        hook.failed(e)
        return wrapped(*args, **kwargs), lambda: (0, 0)
    result = wrapped(*args, **kwargs)

    def moved():
        added = len(encoder_cache) - before
        tensors = list(itertools.islice(reversed(encoder_cache.values()), max(added, 0)))
        return len(tensors), sum(t.nbytes for t in tensors)
    return result, moved


def _save(hook, wrapped, args, kwargs, encoder_cache, mm_hash):
    """save_caches(encoder_cache, mm_hash): one item, the tensor under mm_hash."""
    result = wrapped(*args, **kwargs)
    return result, lambda: (1, encoder_cache[mm_hash].nbytes)


load_wrapper = _transfer(stages.EC_LOAD, LOAD, _load)
save_wrapper = _transfer(stages.EC_SAVE, SAVE, _save)

