"""The stage-duration histogram: the same exposition as one Histogram.observe() per value, and
the worker's durations sent to a scheduler in another process, never to vLLM's shared output."""
from __future__ import annotations

import functools
import random

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from mmscope.emit.stage_timer import WORKER
from mmscope.expose.metrics import STAGE_BUCKETS, STAGE_HISTOGRAM, EncoderCacheProm, MetricClasses
from mmscope.vllm.worker import outputs as runner_output
from mmscope.vllm.patching import Hook
from mmscope.vllm.wire.runner_output import DURATIONS as SENT_DURATIONS

STAGE = "gpu_model_runner: vit_forward"


def _exposition(registry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines()
            if "_created" not in line]


def _ours():
    registry = CollectorRegistry()
    classes = (functools.partial(cls, registry=registry) for cls in (Counter, Gauge, Histogram))
    prom = EncoderCacheProm(MetricClasses(*classes), {0: ["tiny", "0"], 1: ["tiny", "1"]})
    return registry, prom


def _reference():
    registry = CollectorRegistry()
    histogram = Histogram(STAGE_HISTOGRAM[0], STAGE_HISTOGRAM[1], ["model_name", "engine", "stage"],
                          buckets=STAGE_BUCKETS, registry=registry)
    return registry, histogram


def _histogram_lines(registry) -> list[str]:
    return [line for line in _exposition(registry) if line.startswith(STAGE_HISTOGRAM[0])]


def _durations(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    # Values on and right next to every bucket bound, where float and integer comparisons
    # could disagree, plus a spread of ordinary ones up to 20 s.
    edges = [round(b * 1e9) + d for b in STAGE_BUCKETS for d in (-1, 0, 1)]
    return [rng.choice(edges) if rng.random() < 0.5 else rng.randint(0, 20 * 10**9)
            for _ in range(n)]


@pytest.mark.parametrize("n", [1, 3, 16, 500])
def test_bucket_counts_equal_histogram_observe(n):
    registry, prom = _ours()
    ref_registry, ref = _reference()
    values = _durations(n, seed=n)
    half = n // 2
    # two drains of one stage, and a second stage, as the API server receives them
    prom.observe_stages({STAGE: values[:half], "mm:hash:pil_image": values[:3]}, 0)
    prom.observe_stages({STAGE: values[half:]}, 0)
    for d in values:
        ref.labels("tiny", "0", STAGE).observe(d / 1e9)
    for d in values[:3]:
        ref.labels("tiny", "0", "mm:hash:pil_image").observe(d / 1e9)
    assert sorted(_histogram_lines(registry)) == sorted(_histogram_lines(ref_registry))


def test_stages_go_to_their_engine_and_unknown_engines_are_ignored():
    registry, prom = _ours()
    prom.observe_stages({STAGE: [2_000_000]}, 1)
    prom.observe_stages({STAGE: [5]}, 9)
    lines = _histogram_lines(registry)
    counts = {line.split("{")[1].split("}")[0]: float(line.split()[-1])
              for line in lines if "_count" in line}
    assert counts == {f'engine="1",model_name="tiny",stage="{STAGE}"': 1.0}


def _step_output():
    from vllm.v1.outputs import ModelRunnerOutput

    return ModelRunnerOutput(req_ids=["r"], req_id_to_index={"r": 0})


class FakeRunner:  # a model runner stand-in returning vLLM's own output types
    def execute_model(self, scheduler_output):
        return scheduler_output if scheduler_output is not None else _step_output()

    def sample_tokens(self, grammar_output):
        """What a GPU runner returns: an async output, a ModelRunnerOutput once its copy is done."""
        from vllm.v1.outputs import AsyncModelRunnerOutput

        class Pending(AsyncModelRunnerOutput):
            def __init__(self):
                self.output = _step_output()

            def get_output(self):
                return self.output
        return Pending()


ORIGINAL_EXECUTE = FakeRunner.__dict__["execute_model"]


@pytest.fixture
def sending_hook():
    hook = Hook("stage_metrics.test", f"{__name__}:FakeRunner.execute_model", (),
                runner_output.carried, "metrics", "worker")
    saved = WORKER.collected_in_process
    WORKER.drain()
    assert hook.apply() == "applied"
    yield hook
    hook.revert()
    WORKER.drain()
    WORKER.collected_in_process = saved


def test_worker_durations_ride_on_the_output_only_to_a_scheduler_in_another_process(sending_hook):
    WORKER.collected_in_process = False  # a worker process of a multiprocess executor
    WORKER.record("gpu_model_runner: gather_mm_embeddings", 1_000)
    out = FakeRunner().execute_model(None)
    assert getattr(out, SENT_DURATIONS) == {"gpu_model_runner: gather_mm_embeddings": [1_000]}
    assert not WORKER.pending
    out = FakeRunner().execute_model(None)  # nothing pending: nothing sent
    assert not hasattr(out, SENT_DURATIONS)
    WORKER.collected_in_process = True  # the scheduler shares this process: it drains WORKER
    WORKER.record("gpu_model_runner: gather_mm_embeddings", 2_000)
    out = FakeRunner().execute_model(None)
    assert not hasattr(out, SENT_DURATIONS) and WORKER.pending
    # ... and the hook has nothing left to do here: vLLM's method is back, at no cost
    assert FakeRunner.__dict__["execute_model"] is ORIGINAL_EXECUTE
    assert sending_hook.describe().startswith("retired: the scheduler shares this process")


def test_an_async_output_carries_them_once_it_is_a_model_runner_output(sending_hook):
    """sample_tokens of a GPU runner returns an async output: the durations wait for its
    get_output(), after the step's device work, and ride on the ModelRunnerOutput it makes."""
    import wrapt

    WORKER.collected_in_process = False
    wrapper = functools.partial(runner_output.carried, sending_hook)
    WORKER.record("gpu_model_runner: vit_forward", 4_000)
    pending = wrapt.FunctionWrapper(FakeRunner().sample_tokens, wrapper)(None)
    assert vars(pending).keys() == {"output"} and WORKER.pending
    out = wrapt.FunctionWrapper(pending.get_output, wrapper)()
    assert getattr(out, SENT_DURATIONS) == {"gpu_model_runner: vit_forward": [4_000]}
    assert not WORKER.pending


def test_vllms_shared_empty_output_is_never_written_to(sending_hook):
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT

    WORKER.collected_in_process = False
    WORKER.record("gpu_model_runner: vit_forward", 3_000)
    assert FakeRunner().execute_model(EMPTY_MODEL_RUNNER_OUTPUT) is EMPTY_MODEL_RUNNER_OUTPUT
    assert not hasattr(EMPTY_MODEL_RUNNER_OUTPUT, SENT_DURATIONS)
    assert WORKER.pending  # they wait for the next real output
    out = FakeRunner().execute_model(None)
    assert getattr(out, SENT_DURATIONS) == {"gpu_model_runner: vit_forward": [3_000]}
