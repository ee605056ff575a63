"""The stage-duration histogram's batch path: the same exposition as one observe() per value."""
from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from mmscope.vllm import stat_loggers as sl


def _exposition(registry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines()
            if "_created" not in line]


def _histogram():
    registry = CollectorRegistry()
    return registry, Histogram("stage_seconds", "d", ["stage"], buckets=sl.STAGE_BUCKETS,
                               registry=registry).labels("s")


def _durations(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    # Values on and right next to every bucket bound, where float and integer comparisons
    # could disagree, plus a spread of ordinary ones up to 20 s.
    edges = [round(b * 1e9) + d for b in sl.STAGE_BUCKETS for d in (-1, 0, 1)]
    return [rng.choice(edges) if rng.random() < 0.5 else rng.randint(0, 20 * 10**9)
            for _ in range(n)]


def test_bucket_counts_equal_observe_for_small_and_large_batches(wrapper_road):
    for n in (1, 3, 15, 16, 500):
        ref_registry, ref = _histogram()
        registry, child = _histogram()
        values = _durations(n, seed=n)
        for d in values:
            ref.observe(d / 1e9)
        sl.observe_many(child, values)
        ours, theirs = _exposition(registry), _exposition(ref_registry)
        assert [l for l in ours if "_sum" not in l] == [l for l in theirs if "_sum" not in l]
        total = next(float(l.split()[-1]) for l in ours if "_sum" in l)
        assert abs(total - sum(values) / 1e9) <= 1e-9 * max(1.0, total)


def test_values_of_another_class_are_added_through_their_inc(wrapper_road):
    # The multiprocess value class (MmapedValue) is not updated in place: its inc() writes a file.
    class FileValue:
        def __init__(self):
            self.added = []

        def inc(self, amount):
            self.added.append(amount)

    child = type("Child", (), {})()
    child._buckets = [FileValue() for _ in sl.THRESHOLDS_NS]
    child._sum = FileValue()
    sl.observe_many(child, [5_000, 5_000, 2_000_000, 20 * 10**9])
    assert {i: sum(v.added) for i, v in enumerate(child._buckets) if v.added} == {
        0: 2, sl.STAGE_BUCKETS.index(2.5e-3): 1, len(sl.STAGE_BUCKETS): 1}
    assert child._sum.added == [pytest.approx(20.00201)]


def test_a_child_without_prometheus_internals_gets_plain_observe():
    seen = []

    class RayLikeHistogram:  # vLLM's Ray wrappers expose observe() only
        def observe(self, value):
            seen.append(value)

    sl.observe_many(RayLikeHistogram(), [1_500, 2_000_000_000])
    assert seen == [1.5e-6, 2.0]


class FakeRunner:  # a model runner stand-in: execute_model returns an object with a __dict__
    def execute_model(self, scheduler_output):
        return type("Output", (), {})()


def test_worker_durations_ride_on_the_output_only_to_a_scheduler_in_another_process():
    from mmscope.emit.stage_timer import WORKER
    from mmscope.vllm.patching import Hook
    from mmscope.vllm.ranges import worker_timings_attached

    original = FakeRunner.execute_model
    hook = Hook("stage_metrics.test", f"{__name__}:FakeRunner.execute_model",
                ("self", "scheduler_output"), worker_timings_attached, "metrics", "worker")
    saved = WORKER.collected_in_process
    try:
        WORKER.drain()
        WORKER.collected_in_process = False  # a worker process of a multiprocess executor
        assert hook.apply() == "applied" and FakeRunner.execute_model is not original
        WORKER.record("gpu_model_runner: gather_mm_embeddings", 1_000)
        out = FakeRunner().execute_model(None)
        assert out._mmscope_stage_durations == {"gpu_model_runner: gather_mm_embeddings": [1_000]}
        assert not WORKER.pending
        WORKER.collected_in_process = True  # the scheduler shares this process: it drains WORKER
        WORKER.record("gpu_model_runner: gather_mm_embeddings", 2_000)
        out = FakeRunner().execute_model(None)
        assert not hasattr(out, "_mmscope_stage_durations") and WORKER.pending
        # ... and the hook has nothing left to do here: vLLM's method is back, at no cost.
        assert FakeRunner.execute_model is original
        assert hook.describe().startswith("retired: the scheduler shares this process")
        hook.revert()
        assert FakeRunner.execute_model is original and hook.describe() == "not applied"
    finally:
        hook.revert()
        WORKER.drain()
        WORKER.collected_in_process = saved
