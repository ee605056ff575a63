"""Stage durations without a profiler: `timed_stage(name, collector)` is a span that also records
the stage's duration into a per-process collector, drained into Prometheus histograms.

Two collectors, because in an in-process engine the API server and the worker share one process.
A collector's clock says what a duration is: host wall time, or device time read from events.
"""
from __future__ import annotations

import contextlib
import time
from collections import deque

from mmscope import stages
from mmscope.emit import tracing
from mmscope.flags import flag

# A bound on memory between drains; beyond it durations are dropped (and counted).
MAX_PER_STAGE = 20_000


class HostClock:
    """Host wall time, recorded at once: the API server's stages, and a worker's on a CPU,
    where the stage's work is done when its call returns."""

    # The C function itself: a stage starts on every hooked call, most of them in no stage's
    # interest (a decode step's gather), and a Python frame here would cost more than the read.
    start = staticmethod(time.perf_counter_ns)

    def stop(self, collector: "StageCollector", stage: str, started: int) -> None:
        collector.record(stage, time.perf_counter_ns() - started)

    pending = False

    def resolve(self, collector: "StageCollector") -> None:
        pass


class DeviceEventClock:
    """A worker's stages on an accelerator, whose kernels run after the call that queues them
    returns: an event recorded on the current stream before and after the stage, the duration
    read back once the later event has completed (`query()`), never by waiting for it. Each
    drain reads what has completed; the rest waits for the next one.

    Under CUDA graphs an event recorded into a capturing stream becomes a node of the graph, not
    a timestamp, and a query during a capture breaks it: while the current stream captures, a
    stage records nothing and a drain reads nothing (a graph's stage is timed where the graph
    replays, which is no capture). The reads run inside `reading()`, which keeps them from
    breaking a capture that another thread runs (emit/device_events.py).

    `make_event()` returns an event with `record()`, `query()` and `elapsed_time(other)` in ms;
    `capturing()` says whether the current stream captures."""

    def __init__(self, make_event, capturing, reading=contextlib.nullcontext):
        self.make_event, self.capturing, self.reading = make_event, capturing, reading
        self.queued: deque = deque()  # (stage, start event, end event), in the order recorded

    def start(self):
        if self.capturing():
            return None
        event = self.make_event()
        event.record()
        return event

    def stop(self, collector: "StageCollector", stage: str, started) -> None:
        if started is None or self.capturing():  # begun or ended inside a capture: no sample
            return
        end = self.make_event()
        end.record()
        self.queued.append((stage, started, end))

    @property
    def pending(self) -> bool:
        return bool(self.queued)

    def resolve(self, collector: "StageCollector") -> None:
        # Events complete in the order their stream ran them: the first incomplete one stops
        # the read (a stage on another stream waits at most one drain longer).
        queued = self.queued
        if not queued:
            return
        with self.reading():
            if self.capturing():
                return
            while queued and queued[0][2].query():
                stage, started, end = queued.popleft()
                collector.record(stage, round(started.elapsed_time(end) * 1e6))


class StageCollector:
    def __init__(self, step_stages: tuple[str, ...] = ()):
        self.durations: dict[str, list[int]] = {}
        self.dropped = 0
        self.collected_in_process = False  # drained by a consumer in this process (the scheduler)
        # stage -> ns since the last take_step(): what one engine step spent in the stages the
        # requests' shares of it need (carry/ttft_split.py), and only those.
        self.step_stages = frozenset(step_stages)
        self.step_ns: dict[str, int] = {}
        self.clock: HostClock | DeviceEventClock = HostClock()

    def use_device_events(self, clock: DeviceEventClock) -> None:
        """The stages of this process run on an accelerator: time them with its events."""
        if not isinstance(self.clock, DeviceEventClock):
            self.clock = clock

    def record(self, stage: str, duration_ns: int) -> None:
        bucket = self.durations.get(stage)
        if bucket is None:
            bucket = self.durations.setdefault(stage, [])
        if len(bucket) < MAX_PER_STAGE:
            bucket.append(duration_ns)
        else:
            self.dropped += 1
        if stage in self.step_stages:
            self.step_ns[stage] = self.step_ns.get(stage, 0) + duration_ns

    def take_step(self) -> dict[str, int]:
        self.clock.resolve(self)
        step, self.step_ns = self.step_ns, {}
        return step

    @property
    def pending(self) -> bool:
        return bool(self.durations) or self.clock.pending

    def drain(self) -> dict[str, list[int]]:
        self.clock.resolve(self)
        # A copy, then clear(): each is one step under the GIL, so a duration appended between
        # the two lands in a list that is in the copy, not lost.
        drained = self.durations.copy()
        self.durations.clear()
        return drained


class UncountedCollector(StageCollector):
    """Where the durations of work done for no request go (vLLM's warm-up): nowhere."""

    def record(self, stage: str, duration_ns: int) -> None:
        pass


FRONTEND = StageCollector()  # API server: hashing, processor stages
# model runner: encoder forward, EC transfer, gather, embed; a step's encoder and EC-load time is
# shared among its requests (vllm/engine_core/step_shares.py)
WORKER = StageCollector(step_stages=(stages.VIT_FORWARD, stages.EC_LOAD))
UNCOUNTED = UncountedCollector()

ENABLED = flag("MMSCOPE_STAGE_METRICS", default=True)


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
        self._t0 = self.collector.clock.start()
        if self.inner is None:
            return None
        try:
            return self.inner.__enter__()
        except BaseException:
            self._close(None, None, None)
            raise

    def __exit__(self, exc_type, exc, tb):
        if self.inner is None and self._span is None:  # most stages: a duration, nothing else
            if ENABLED:
                self.collector.clock.stop(self.collector, self.name, self._t0)
            return False
        if self.inner is None:
            self._close(exc_type, exc, tb)
            return False
        try:
            return self.inner.__exit__(exc_type, exc, tb)
        finally:
            self._close(exc_type, exc, tb)

    def _close(self, exc_type, exc, tb):
        if ENABLED:
            self.collector.clock.stop(self.collector, self.name, self._t0)
        if self._span is not None:
            self._span.__exit__(exc_type, exc, tb)


def merge(into: dict[str, list[int]], more: dict[str, list[int]] | None) -> dict[str, list[int]]:
    """Add `more` into `into`, keeping at most MAX_PER_STAGE values per stage."""
    for stage, values in (more or {}).items():
        bucket = into.setdefault(stage, [])
        bucket.extend(values[: max(0, MAX_PER_STAGE - len(bucket))])
    return into
