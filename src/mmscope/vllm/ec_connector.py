"""The worker-side EC connector's load and save: timed as stages (docs/design.md §3) and counted as
transfers (items, bytes, host seconds by direction), carried to EngineCore like the stage durations.
"""
from __future__ import annotations

import itertools
import time

from mmscope import stages
from mmscope.emit import tracing
from mmscope.emit.stage_timer import ENABLED, WORKER
from mmscope.expose.metrics import DIRECTIONS
from mmscope.vllm.patching import failed

HOOK = "ranges.ec_connector"


class TransferCounts:
    """`{"items:load": n, "bytes:load": b, "ns:load": t, ...}` since the last drain, per process:
    filled by the worker's wrappers, and in EngineCore by what a worker process sent."""

    def __init__(self):
        self.counts: dict[str, int] = {}

    def add(self, direction: str, items: int, nbytes: int, ns: int) -> None:
        for kind, n in (("items", items), ("bytes", nbytes), ("ns", ns)):
            key = f"{kind}:{direction}"
            self.counts[key] = self.counts.get(key, 0) + n

    def merge(self, more: dict[str, int] | None) -> None:
        for key, n in (more or {}).items():
            self.counts[key] = self.counts.get(key, 0) + n

    @property
    def pending(self) -> bool:
        return bool(self.counts)

    def drain(self) -> dict[str, int]:
        drained, self.counts = self.counts, {}
        return drained


TRANSFERS = TransferCounts()


def _cache_arg(args, kwargs) -> dict:
    return kwargs["encoder_cache"] if "encoder_cache" in kwargs else args[0]


def _transfer(stage: str, direction: str, call):
    """A wrapper that runs `call(wrapped, args, kwargs) -> (result, items, bytes)` as one timed
    stage (a span too while tracing) and counts what it moved; a call that moved nothing is a
    stage sample only, so that seconds per item is the cost of a transfer. The stage sample is
    read from the worker's clock (device time on an accelerator); a transfer's seconds are the
    call's host wall time, which holds the connector's file or network I/O."""
    def _timed(wrapped, args, kwargs):
        started = WORKER.clock.start() if ENABLED else None
        t0 = time.perf_counter_ns()
        result, moved = call(wrapped, args, kwargs)
        elapsed = time.perf_counter_ns() - t0
        try:
            if ENABLED:
                WORKER.clock.stop(WORKER, stage, started)
            items, nbytes = moved()
            if items:
                TRANSFERS.add(direction, items, nbytes, elapsed)
        except Exception as e:  # noqa: BLE001 - ours: the hook turns off, vLLM goes on
            failed(HOOK, e)
        return result
    return tracing.spanned(stage, _timed)


def _load(wrapped, args, kwargs):
    """start_load_caches(encoder_cache) adds the loaded mm_hashes to the dict, which keeps
    insertion order: the new entries are its last ones."""
    try:
        cache = _cache_arg(args, kwargs)
        before = len(cache)
    except Exception as e:  # noqa: BLE001
        failed(HOOK, e)
        return wrapped(*args, **kwargs), lambda: (0, 0)
    result = wrapped(*args, **kwargs)

    def moved():
        added = len(cache) - before
        tensors = list(itertools.islice(reversed(cache.values()), max(added, 0)))
        return len(tensors), sum(t.nbytes for t in tensors)
    return result, moved


def _save(wrapped, args, kwargs):
    """save_caches(encoder_cache, mm_hash): one item, the tensor under mm_hash."""
    result = wrapped(*args, **kwargs)

    def moved():
        mm_hash = kwargs["mm_hash"] if "mm_hash" in kwargs else args[1]
        return 1, _cache_arg(args, kwargs)[mm_hash].nbytes
    return result, moved


load_wrapper = _transfer(stages.EC_LOAD, DIRECTIONS[0], _load)
save_wrapper = _transfer(stages.EC_SAVE, DIRECTIONS[1], _save)

