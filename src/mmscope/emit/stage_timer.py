"""Stage durations without a profiler: `timed_stage(name, collector)` is a span that also records
its host wall time into a per-process collector, drained into Prometheus histograms.

Two collectors, because in an in-process engine the API server and the worker share one process.
"""
from __future__ import annotations

import os
import time

from mmscope.emit import tracing

# A bound on memory between drains; beyond it durations are dropped (and counted).
MAX_PER_STAGE = 20_000


class StageCollector:
    def __init__(self):
        self.durations: dict[str, list[int]] = {}
        self.dropped = 0
        self.collected_in_process = False  # drained by a consumer in this process (the scheduler)
        # stage -> ns since the last take_step(): what one engine step spent in each stage, for
        # the requests' shares of it (carry/ttft.py); a few keys, never more.
        self.step_ns: dict[str, int] = {}

    def record(self, stage: str, duration_ns: int) -> None:
        bucket = self.durations.get(stage)
        if bucket is None:
            bucket = self.durations.setdefault(stage, [])
        if len(bucket) < MAX_PER_STAGE:
            bucket.append(duration_ns)
        else:
            self.dropped += 1
        self.step_ns[stage] = self.step_ns.get(stage, 0) + duration_ns

    def take_step(self) -> dict[str, int]:
        step, self.step_ns = self.step_ns, {}
        return step

    @property
    def pending(self) -> bool:
        return bool(self.durations)

    def drain(self) -> dict[str, list[int]]:
        # A copy, then clear(): each is one step under the GIL, so a duration appended between
        # the two lands in a list that is in the copy, not lost.
        drained = self.durations.copy()
        self.durations.clear()
        return drained


FRONTEND = StageCollector()  # API server: hashing, processor stages
WORKER = StageCollector()  # model runner: encoder forward, EC transfer, gather, embed

ENABLED = os.environ.get("MMSCOPE_STAGE_METRICS", "1").strip() not in ("0", "false", "no")


class timed_stage:
    """`with timed_stage(name, WORKER):` a tracing span plus a duration for the histograms, around
    `inner` (another context manager, e.g. vLLM's own timer) where one is given."""

    __slots__ = ("name", "collector", "inner", "_span", "_t0")

    def __init__(self, name: str, collector: StageCollector, inner=None):
        self.name, self.collector, self.inner = name, collector, inner
        # No span object at all while tracing is off: this runs several times per step.
        self._span = tracing.span(name) if tracing.on else None

    def __enter__(self):
        if self._span is not None:
            self._span.__enter__()
        self._t0 = time.perf_counter_ns()
        if self.inner is None:
            return None
        try:
            return self.inner.__enter__()
        except BaseException:
            self._close(None, None, None)
            raise

    def __exit__(self, exc_type, exc, tb):
        try:
            return self.inner.__exit__(exc_type, exc, tb) if self.inner is not None else False
        finally:
            self._close(exc_type, exc, tb)

    def _close(self, exc_type, exc, tb):
        elapsed = time.perf_counter_ns() - self._t0
        if self._span is not None:
            self._span.__exit__(exc_type, exc, tb)
        if ENABLED:
            self.collector.record(self.name, elapsed)


def merge(into: dict[str, list[int]], more: dict[str, list[int]] | None) -> dict[str, list[int]]:
    """Add `more` into `into`, keeping at most MAX_PER_STAGE values per stage."""
    for stage, values in (more or {}).items():
        bucket = into.setdefault(stage, [])
        bucket.extend(values[: max(0, MAX_PER_STAGE - len(bucket))])
    return into
