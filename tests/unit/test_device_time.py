"""A worker stage on an accelerator is sampled in device time: events recorded around it, read back
once they completed, never by waiting for them. CPUs have no device events, so the seam is driven
by a stream of this test's: work queued on it runs later, on its own thread, as a GPU's does."""
from __future__ import annotations

import queue
import threading
import time

import pytest

from mmscope import stages
from mmscope.emit import stage_timer
from mmscope.emit.stage_timer import WORKER, DeviceEventClock, HostClock, StageCollector
from mmscope.vllm.worker import preprocess_stages as worker_stages


class Stream:
    """Runs queued work in order on its own thread; `gate` holds the work back until set."""

    def __init__(self):
        self.jobs: queue.Queue = queue.Queue()
        self.gate = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            job = self.jobs.get()
            self.gate.wait()
            job()
            self.jobs.task_done()

    def busy(self, seconds: float) -> None:
        self.jobs.put(lambda: time.sleep(seconds))

    def finish(self) -> None:
        self.gate.set()
        self.jobs.join()


class StreamEvent:
    """The event interface the clock reads: record() queues a timestamp on the stream, query() is
    true once it was taken, elapsed_time() in ms. Waiting on it is what the clock must never do."""

    def __init__(self, stream: Stream):
        self.stream, self.at = stream, None

    def record(self):
        self.stream.jobs.put(lambda: setattr(self, "at", time.perf_counter_ns()))

    def query(self) -> bool:
        return self.at is not None

    def elapsed_time(self, end: "StreamEvent") -> float:
        return (end.at - self.at) / 1e6

    def synchronize(self):
        raise AssertionError("the clock waited for the device")


@pytest.fixture
def stream():
    s = Stream()
    yield s
    s.finish()


def test_a_sample_is_the_device_time_once_its_events_completed(stream):
    collector = StageCollector()
    collector.use_device_events(lambda: StreamEvent(stream))
    host_t0 = time.perf_counter_ns()
    with stage_timer.timed_stage(stages.VIT_FORWARD, collector):
        stream.busy(0.05)  # queued: the call returns at once
    host_ns = time.perf_counter_ns() - host_t0
    assert collector.pending and collector.drain() == {}  # not completed: nothing read, no wait
    stream.finish()
    (device_ns,) = collector.drain()[stages.VIT_FORWARD]
    assert device_ns >= 50_000_000 > host_ns
    assert not collector.pending


def test_samples_are_read_in_the_order_their_stream_ran_them(stream):
    clock = DeviceEventClock(lambda: StreamEvent(stream))
    collector = StageCollector(step_stages=(stages.EC_LOAD, stages.VIT_FORWARD))
    collector.clock = clock
    first = clock.start()
    stream.busy(0.01)
    clock.stop(collector, stages.EC_LOAD, first)
    second = clock.start()
    clock.stop(collector, stages.VIT_FORWARD, second)
    third = clock.start()
    clock.stop(collector, stages.GATHER_MM_EMBEDDINGS, third)  # no request's share: no step total
    assert collector.take_step() == {}
    stream.finish()
    step = collector.take_step()
    assert list(step) == [stages.EC_LOAD, stages.VIT_FORWARD]
    assert step[stages.EC_LOAD] >= 10_000_000
    assert list(collector.drain()) == [stages.EC_LOAD, stages.VIT_FORWARD,
                                       stages.GATHER_MM_EMBEDDINGS]


def test_the_worker_wrappers_sample_through_the_workers_clock(stream, monkeypatch):
    """worker_stages.timed, as every worker stage but vit_forward uses it."""
    monkeypatch.setattr(WORKER, "clock", DeviceEventClock(lambda: StreamEvent(stream)))
    WORKER.drain()
    wrapper = worker_stages.timed(stages.EMBED_INPUT_IDS)

    def embed():
        stream.busy(0.02)
        return "embeddings"
    assert wrapper(None, embed, None, (), {}) == "embeddings"
    assert WORKER.drain() == {}
    stream.finish()
    (ns,) = WORKER.drain()[stages.EMBED_INPUT_IDS]
    assert ns >= 20_000_000


def test_a_runner_on_an_accelerator_switches_the_worker_to_device_events(monkeypatch):
    import torch

    monkeypatch.setattr(WORKER, "clock", HostClock())
    worker_stages._time_on_device(torch.device("cpu"))
    assert isinstance(WORKER.clock, HostClock)  # a CPU's stages are done when their call returns
    worker_stages._time_on_device(torch.device("cuda", 0))
    assert isinstance(WORKER.clock, DeviceEventClock)
