"""A worker stage on an accelerator is sampled in device time: events recorded around it, read back
once they completed, never by waiting for them. CPUs have no device events, so the seam is driven
by a stream of this test's: work queued on it runs later, on its own thread, as a GPU's does."""
from __future__ import annotations

import contextlib
import queue
import threading
import time

import pytest

from mmscope import stages
from mmscope.emit import stage_timer
from mmscope.emit.stage_timer import WORKER, DeviceEventClock, HostClock, StageCollector
from mmscope.emit import tracing
from mmscope.vllm.worker import ec_connector, preprocess_stages as worker_stages
from tests.kit import traces as tk


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


class Capture:
    """The device's answer to "is the current stream capturing a graph?", as the clock asks it."""

    def __init__(self):
        self.on = False

    def __call__(self) -> bool:
        return self.on


NO_CAPTURE = Capture()


class StreamEvent:
    """The event interface the clock reads: record() queues a timestamp on the stream, query() is
    true once it was taken, elapsed_time() in ms. Waiting on it is what the clock must never do;
    recording or reading it while the stream captures is what a CUDA graph capture forbids."""

    def __init__(self, stream: Stream, capture: Capture = NO_CAPTURE):
        self.stream, self.capture, self.at = stream, capture, None

    def record(self):
        assert not self.capture.on, "an event recorded into a capture: a graph node, no time"
        self.stream.jobs.put(lambda: setattr(self, "at", time.perf_counter_ns()))

    def query(self) -> bool:
        assert not self.capture.on, "an event read during a capture: the capture breaks"
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
    collector.use_device_events(DeviceEventClock(lambda: StreamEvent(stream), NO_CAPTURE))
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
    clock = DeviceEventClock(lambda: StreamEvent(stream), NO_CAPTURE)
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
    monkeypatch.setattr(WORKER, "clock", DeviceEventClock(lambda: StreamEvent(stream), NO_CAPTURE))
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


class Tensor:
    nbytes = 4096


def test_a_stage_timed_while_the_stream_captures_records_no_event_and_loses_nothing_else(
        stream, monkeypatch, tmp_path):
    """Inside a CUDA-graph capture a stage records no event and a drain reads none; its range,
    the EC transfer's counts, the stages timed before the capture all stay."""
    capture, made = Capture(), []

    def make_event():
        made.append(StreamEvent(stream, capture))
        return made[-1]
    monkeypatch.setattr(WORKER, "clock", DeviceEventClock(make_event, capture))
    WORKER.drain(), ec_connector.TRANSFERS.drain()
    tracing.configure("chrome", str(tmp_path))
    try:
        with stage_timer.timed_stage(stages.EC_LOAD, WORKER):  # before the capture: sampled
            stream.busy(0.01)
        straddling = WORKER.clock.start()  # a stage that begins before the capture, ends in it
        capture.on = True
        made_before = len(made)
        with stage_timer.timed_stage(stages.VIT_FORWARD, WORKER):
            stream.busy(0.01)
        embed = worker_stages.timed(stages.EMBED_INPUT_IDS)
        assert embed(None, lambda: "embeddings", None, (), {}) == "embeddings"
        assert ec_connector.save_wrapper(None, lambda: "saved", None, (), {},
                                         {"h": Tensor()}, "h") == "saved"
        WORKER.clock.stop(WORKER, stages.GATHER_MM_EMBEDDINGS, straddling)
        assert len(made) == made_before  # no event made, none recorded in the capture
        assert WORKER.drain() == {}  # nothing read while the stream captures
        capture.on = False
        stream.finish()
        durations = WORKER.drain()
        tracing.flush()
    finally:
        tracing.configure("off")
    assert list(durations) == [stages.EC_LOAD] and durations[stages.EC_LOAD][0] >= 10_000_000
    assert not WORKER.pending
    transfers = ec_connector.TRANSFERS.drain()  # counted as ever, in host time
    assert transfers["items:save"] == 1 and transfers["bytes:save"] == 4096
    assert transfers["ns:save"] > 0
    assert [r.name for r in tk.load(tmp_path)[0]] == [
        stages.EC_LOAD, stages.VIT_FORWARD, stages.EMBED_INPUT_IDS, stages.EC_SAVE]


def test_a_cuda_devices_clock_asks_torch_whether_the_stream_captures(monkeypatch):
    """The worker's clock on a CUDA device asks torch.cuda.is_current_stream_capturing: told
    yes, a stage makes no event (this CPU build of torch could not make a CUDA one)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(WORKER, "clock", HostClock())
    worker_stages._time_on_device(torch.device("cuda", 0))
    wrapper = worker_stages.timed(stages.EMBED_INPUT_IDS)
    assert wrapper(None, lambda: "embeddings", None, (), {}) == "embeddings"
    with stage_timer.timed_stage(stages.VIT_FORWARD, WORKER):
        pass
    assert not WORKER.pending and WORKER.drain() == {}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(WORKER, "clock", HostClock())
    worker_stages._time_on_device(torch.device("cuda", 0))
    with pytest.raises(RuntimeError, match="cuda"):  # outside a capture it does make one
        WORKER.clock.start()


def test_events_are_read_only_in_the_clocks_reading_mode(stream):
    """A drain, from whatever thread, reads the events inside `reading()` (on CUDA: this
    thread's capture mode made thread-local, so another thread's capture is not broken)."""
    inside = []

    @contextlib.contextmanager
    def reading():
        inside.append(True)
        yield
        inside.pop()

    class Checked(StreamEvent):
        def query(self):
            assert inside, "read outside the reading mode"
            return super().query()

    collector = StageCollector()
    collector.use_device_events(DeviceEventClock(lambda: Checked(stream), NO_CAPTURE, reading))
    with stage_timer.timed_stage(stages.VIT_FORWARD, collector):
        stream.busy(0.001)
    stream.finish()
    drained = []
    reader = threading.Thread(target=lambda: drained.append(collector.drain()))
    reader.start()
    reader.join()
    assert list(drained[0]) == [stages.VIT_FORWARD] and not inside
