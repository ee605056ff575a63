"""The stage wrappers on vLLM's own classes: each records one duration per call under its range
name, is a traced range while tracing, and keeps vLLM's results, errors and own timing figures."""
from __future__ import annotations

import contextlib
import logging
import time

import pytest
import wrapt

from mmscope import stages
from mmscope.emit import tracing
from mmscope.emit.stage_timer import FRONTEND, MAX_PER_STAGE, WORKER
from mmscope.vllm import patching, targets
from mmscope.vllm.worker import preprocess_stages as worker_stages
from mmscope.vllm.patching import Hook, Status
from tests.kit import traces as tk


@pytest.fixture(autouse=True)
def clean_collectors():
    WORKER.drain(), FRONTEND.drain()
    yield
    WORKER.drain(), FRONTEND.drain()
    tracing.configure("off")


@contextlib.contextmanager
def applied(name: str):
    """One row of the real target table, applied to vLLM's class for the block."""
    hook = targets.TABLE.by_name[name]
    assert hook.apply() is Status.APPLIED, hook.describe()
    try:
        yield hook
    finally:
        hook.revert()


def counts(collector) -> dict[str, int]:
    return {k: len(v) for k, v in collector.drain().items()}


def traced_names(trace_dir) -> list[str]:
    tracing.flush()
    return [r.name for r in tk.load(trace_dir)[0]]


# --- processor stages: vLLM's TimingContext.record -------------------------------------------
STAGES = ("get_mm_hashes", "apply_hf_processor", "apply_hf_processor")


def run_stages(timing):
    for stage in STAGES:
        with timing.record(stage) as block:
            assert block is None  # what vLLM's record() yields, on or off
            time.sleep(0.002)
    with pytest.raises(ValueError, match="vLLM's own error"):
        with timing.record("apply_prompt_updates"):
            raise ValueError("vLLM's own error")


@pytest.mark.parametrize("vllm_timing", [True, False])
def test_vllm_timing_context_keeps_its_own_figures_under_the_stage_timer(vllm_timing):
    from vllm.multimodal.processing.context import TimingContext

    with applied("ranges.processor_stages"):
        timing = TimingContext(enabled=vllm_timing)
        run_stages(timing)
    if vllm_timing:  # vLLM's own figures, as without mmscope: the failed block counted too
        assert sorted(timing.stage_secs) == ["apply_hf_processor", "apply_prompt_updates",
                                             "get_mm_hashes"]
        assert timing.stage_secs["apply_hf_processor"] >= 0.004
        assert timing.stage_secs["get_mm_hashes"] >= 0.002
    else:  # vLLM's timing off: its record() only yields, and still records nothing
        assert timing.stage_secs == {}
    assert counts(FRONTEND) == {stages.processor_range("get_mm_hashes"): 1,
                                stages.processor_range("apply_hf_processor"): 2,
                                stages.processor_range("apply_prompt_updates"): 1}


def test_with_vllm_timing_on_its_figures_match_a_run_without_mmscope():
    from vllm.multimodal.processing.context import TimingContext

    plain = TimingContext(enabled=True)
    run_stages(plain)
    with applied("ranges.processor_stages"):
        hooked = TimingContext(enabled=True)
        run_stages(hooked)
    assert sorted(plain.stage_secs) == sorted(hooked.stage_secs)
    assert plain.get_stats_dict().keys() == hooked.get_stats_dict().keys()


def test_processor_stages_are_traced_ranges(tmp_path):
    from vllm.multimodal.processing.context import TimingContext

    tracing.configure("chrome", str(tmp_path))
    with applied("ranges.processor_stages"):
        for enabled in (True, False):
            with TimingContext(enabled=enabled).record("apply_hf_processor"):
                pass
    assert traced_names(tmp_path) == [stages.processor_range("apply_hf_processor")] * 2
    assert counts(FRONTEND) == {stages.processor_range("apply_hf_processor"): 2}


# --- MultiModalHasher.hash_kwargs -------------------------------------------------------------
def hash_calls():
    import numpy as np
    import torch
    from PIL import Image
    from vllm.multimodal.media import MediaWithBytes

    picture = Image.new("RGB", (8, 8), "red")
    return [({"image": picture}, "pil_image"),
            ({"image": MediaWithBytes(picture, b"png")}, "image_bytes"),
            ({"video": MediaWithBytes(np.zeros((2, 4, 4, 3), np.uint8), b"mp4")}, "video"),
            ({"image": b"raw", "model_id": "m"}, "bytes"),
            ({"text": "a prompt"}, "str"),
            ({"n": 3}, "number"),
            ({"t": torch.arange(6)}, "tensor"),
            ({"a": np.arange(6)}, "ndarray"),
            ({"other": {1, 2}}, "pickle"),
            # containers are hashed element by element: named after their first element
            ({"video": (np.zeros((2, 4, 4, 3), np.uint8), {"fps": 2})}, "ndarray"),
            ({"image": [picture, picture]}, "pil_image"),
            ({"audio": {"array": np.zeros(16), "sr": 16000}}, "ndarray"),
            ({"image": picture, "video": b"raw"}, "mixed")]


@pytest.mark.parametrize("tracing_on", [False, True])
def test_hash_ranges_name_each_branch_on_vllms_hasher(tmp_path, tracing_on):
    from vllm.multimodal.hasher import MultiModalHasher

    calls = hash_calls()
    expected = [MultiModalHasher.hash_kwargs("sha256", **kw) for kw, _ in calls]
    if tracing_on:
        tracing.configure("chrome", str(tmp_path))
    with applied("ranges.hash"):
        assert [MultiModalHasher.hash_kwargs("sha256", **kw) for kw, _ in calls] == expected
    assert isinstance(MultiModalHasher.__dict__["hash_kwargs"], classmethod)
    names = [stages.hash_range(branch) for _, branch in calls]
    assert counts(FRONTEND) == {n: names.count(n) for n in names}
    if tracing_on:
        assert sorted(traced_names(tmp_path)) == sorted(names)


# --- the encoder forward: GPUModelRunner.timed_encoder_operation -----------------------------
def bare_runner():
    """A GPUModelRunner without its engine: timed_encoder_operation(should_time=False) reads
    nothing of it (should_time=True synchronizes a device, which a CPU has not)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return object.__new__(GPUModelRunner)


def test_the_encoder_forward_is_one_vit_forward_range_per_encoder_batch(tmp_path):
    runner = bare_runner()
    with applied("ranges.vit_forward"):
        for item in range(3):  # three encoder batches
            with runner.timed_encoder_operation(False, [], item, 1) as block:
                assert block is None
        with pytest.raises(RuntimeError, match="encoder failed"):
            with runner.timed_encoder_operation(False, [], 3, 1):
                raise RuntimeError("encoder failed")  # vLLM's own error inside the block
        assert counts(WORKER) == {stages.VIT_FORWARD: 4}
        tracing.configure("chrome", str(tmp_path))
        with runner.timed_encoder_operation(False, [], 0, 2):
            time.sleep(0.001)
    assert traced_names(tmp_path) == [stages.VIT_FORWARD]
    assert counts(WORKER) == {stages.VIT_FORWARD: 1}


# --- the encoder forward under Model Runner V2 ---------------------------------------------------
class TinyEncoder:
    """A model's embed_multimodal: one output per item of the batch."""

    def embed_multimodal(self, **batch):
        return [f"embedding of {item}" for item in batch["items"]]


def bare_encoder_runner():
    """V2's EncoderRunner without a model runner: timed_encoder_operation with timing off (vLLM's
    default) only yields; the model's method is wrapped as the runner's load_model wraps it."""
    from vllm.v1.worker.gpu.mm.encoder_runner import EncoderRunner

    encoder = object.__new__(EncoderRunner)
    encoder.enable_timing, encoder.model = False, TinyEncoder()
    patching.wrap_instance(encoder.model, "embed_multimodal", worker_stages.encoder_batch,
                           targets.TABLE.by_name["ranges.embed_input_ids.v2"])
    return encoder


def test_v2_encoder_batches_are_vit_forward_only_inside_a_steps_encoder_operation(tmp_path):
    """V2 runs a step's batches inside one timed_encoder_operation; its warm-up
    (profile_encoder_cache) calls the model outside any: no range, no sample."""
    encoder = bare_encoder_runner()
    tracing.configure("chrome", str(tmp_path))
    with applied("ranges.vit_forward.v2"):
        assert encoder.model.embed_multimodal(items=[0]) == ["embedding of 0"]  # warm-up
        with encoder.timed_encoder_operation(["r1", "r2"]) as block:
            assert block is None
            for batch in ([1, 2], [3]):  # two batches: two modalities, say
                assert encoder.model.embed_multimodal(items=batch) == [
                    f"embedding of {i}" for i in batch]
        with pytest.raises(RuntimeError, match="encoder failed"):
            with encoder.timed_encoder_operation(["r3"]):
                raise RuntimeError("encoder failed")  # vLLM's own error inside the block
        encoder.model.embed_multimodal(items=[4])  # outside again
    assert counts(WORKER) == {stages.VIT_FORWARD: 2}
    assert traced_names(tmp_path) == [stages.VIT_FORWARD] * 2


def test_the_encoder_graphs_eager_road_is_one_batch_not_two(tmp_path):
    """A batch beyond the encoder's CUDA-graph budgets runs eagerly inside
    EncoderCudaGraphManager.execute, through the model's embed_multimodal (vLLM 0.34's
    Pixtral): one vit_forward range and sample, not one nested in another."""
    from vllm.v1.worker.encoder_cudagraph import EncoderCudaGraphManager

    encoder = bare_encoder_runner()
    manager = object.__new__(EncoderCudaGraphManager)
    manager.use_dp, manager.graph_hits, manager.graph_misses = False, 0, 0
    manager.log_stats_interval = 100
    manager.get_cumulative_stats = dict
    manager._execute_local = lambda batch: encoder.model.embed_multimodal(**batch)
    tracing.configure("chrome", str(tmp_path))
    with applied("ranges.vit_forward.v2"), applied("ranges.vit_forward.v2.cudagraph"):
        with encoder.timed_encoder_operation(["r1"]):
            assert manager.execute({"items": [1, 2]}) == ["embedding of 1", "embedding of 2"]
            assert encoder.model.embed_multimodal(items=[3]) == ["embedding of 3"]
    assert counts(WORKER) == {stages.VIT_FORWARD: 2}
    assert traced_names(tmp_path) == [stages.VIT_FORWARD] * 2


@pytest.mark.parametrize("hook_name, drafter_call", [
    ("ranges.gather_mm_embeddings", {"shift_computed_tokens": 1}),
    ("ranges.gather_mm_embeddings.v2", {"draft_lookahead": 1})])
def test_the_drafters_gather_is_not_the_stage(tmp_path, hook_name, drafter_call):
    """Speculative decoding's drafter gathers one token ahead: not the step's stage."""
    hook = targets.TABLE.by_name[hook_name]
    (param, lookahead), = drafter_call.items()
    assert hook.params == (param,)  # the wrapper receives the drafter's parameter by its name
    seen = []

    def gather(*args, **kwargs):
        seen.append(kwargs)
        return ["embedding"], "mask"
    tracing.configure("chrome", str(tmp_path))
    assert hook.wrapper(hook, gather, None, (), drafter_call, lookahead) == (["embedding"], "mask")
    assert not WORKER.pending
    hook.wrapper(hook, gather, None, (), {}, 0)
    assert counts(WORKER) == {stages.GATHER_MM_EMBEDDINGS: 1} and len(seen) == 2
    assert traced_names(tmp_path) == [stages.GATHER_MM_EMBEDDINGS]


# --- timed methods -----------------------------------------------------------------------------
class Runner:
    def _gather_mm_embeddings(self, scheduler_output, shift_computed_tokens=0, scale=1):
        """(mm_embeds, is_mm_embed) as vLLM returns them; a decode step gathers none."""
        if scheduler_output < 0:
            raise ValueError("vLLM's own error")
        return [scale] * scheduler_output, "mask"


def timed_hook() -> Hook:
    return Hook("test.gather", f"{__name__}:Runner._gather_mm_embeddings",
                ("shift_computed_tokens",), worker_stages.gather_mm_embeddings, "ranges", "worker")


@pytest.mark.parametrize("tracing_on", [False, True])
def test_a_timed_method_records_once_per_call_and_keeps_results_and_errors(tmp_path, tracing_on):
    if tracing_on:
        tracing.configure("chrome", str(tmp_path))
    hook = timed_hook()
    hook.apply()
    try:
        assert Runner()._gather_mm_embeddings(3, scale=2) == ([2, 2, 2], "mask")
        assert Runner()._gather_mm_embeddings(1) == ([1], "mask")
        with pytest.raises(ValueError, match="vLLM's own error"):
            Runner()._gather_mm_embeddings(-1)
        WORKER.drain()
        # a decode step gathers no multimodal embeddings: no histogram sample, traced or not
        assert Runner()._gather_mm_embeddings(0) == ([], "mask")
        assert not WORKER.pending
    finally:
        hook.revert()
    if tracing_on:
        assert traced_names(tmp_path)[:2] == [stages.GATHER_MM_EMBEDDINGS] * 2


def test_two_calls_give_two_samples():
    hook = timed_hook()
    hook.apply()
    try:
        Runner()._gather_mm_embeddings(3, scale=2)
        Runner()._gather_mm_embeddings(1)
    finally:
        hook.revert()
    durations = WORKER.drain()[stages.GATHER_MM_EMBEDDINGS]
    assert len(durations) == 2 and all(d > 0 for d in durations)


class Preprocessing(Runner):
    def _prepare_mm_inputs(self, num_tokens):
        return None, num_tokens


def test_preparing_the_inputs_gives_a_sample_only_in_a_step_that_gathered_embeddings(tmp_path):
    """vLLM's _preprocess gathers, then prepares the inputs, every step: a decode step's prepare
    is no multimodal work, so only a step whose gather found embeddings gives its sample. V1's
    dummy runs (warm-up, profiling, graph capture) prepare inputs with no gather: no step, no
    range."""
    hooks = [Hook("test.gather", f"{__name__}:Preprocessing._gather_mm_embeddings",
                  ("shift_computed_tokens",), worker_stages.gather_mm_embeddings, "ranges",
                  "worker"),
             Hook("test.prepare", f"{__name__}:Preprocessing._prepare_mm_inputs", (),
                  worker_stages.prepare_mm_inputs, "ranges", "worker")]
    for hook in hooks:
        hook.apply()
    worker_stages._step_gathered = None  # as in a new worker (other tests gathered)
    tracing.configure("chrome", str(tmp_path))
    try:
        runner = Preprocessing()
        assert runner._prepare_mm_inputs(7) == (None, 7)  # a dummy run at start-up
        for step_embeddings in (2, 0, 0, 1, 0):  # a prefill with an image, decodes, another
            runner._gather_mm_embeddings(step_embeddings)
            assert runner._prepare_mm_inputs(7) == (None, 7)
        runner._prepare_mm_inputs(7)  # another dummy run
    finally:
        for hook in hooks:
            hook.revert()
    assert counts(WORKER) == {stages.GATHER_MM_EMBEDDINGS: 2, stages.PREPARE_MM_INPUTS: 2}
    assert traced_names(tmp_path) == [stages.GATHER_MM_EMBEDDINGS, stages.PREPARE_MM_INPUTS] * 5


def test_the_table_times_vllms_gather_and_prepare_methods():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    for name, attr in (("ranges.gather_mm_embeddings", "_gather_mm_embeddings"),
                       ("ranges.prepare_mm_inputs", "_prepare_mm_inputs")):
        original = GPUModelRunner.__dict__[attr]
        with applied(name):
            assert GPUModelRunner.__dict__[attr].__wrapped__ is original
        assert GPUModelRunner.__dict__[attr] is original


def test_a_full_stage_counts_drops_instead_of_growing():
    hook = timed_hook()
    hook.apply()
    try:
        WORKER.durations[stages.GATHER_MM_EMBEDDINGS] = [1] * MAX_PER_STAGE
        dropped = WORKER.dropped
        assert Runner()._gather_mm_embeddings(1) == ([1], "mask")
        assert len(WORKER.durations[stages.GATHER_MM_EMBEDDINGS]) == MAX_PER_STAGE
        assert WORKER.dropped == dropped + 1
    finally:
        hook.revert()


# --- instance methods: the model's embed_input_ids, the EC connector's load and save ---------
class Model:  # vLLM's SupportsMultiModal.embed_input_ids
    def embed_input_ids(self, input_ids, multimodal_embeddings=None, *, is_multimodal=None):
        return [i * 2 for i in input_ids]


def test_instance_methods_are_unwrapped_and_wrapped_again_by_uninstrument_and_instrument():
    from mmscope.vllm.instrumentor import VllmInstrumentor

    model = Model()
    timed_embed = worker_stages.timed(stages.EMBED_INPUT_IDS)
    hook = Hook("test.model", f"{__name__}:Model.embed_input_ids", (), timed_embed, "ranges",
                "worker")
    patching.wrap_instance(model, "embed_input_ids", timed_embed, hook)
    patching.wrap_instance(model, "embed_input_ids", timed_embed, hook)  # once only
    assert model.embed_input_ids([1, 2]) == [2, 4]
    assert counts(WORKER) == {stages.EMBED_INPUT_IDS: 1}
    instrumentor = VllmInstrumentor()
    instrumentor.uninstrument()
    try:
        assert not isinstance(model.embed_input_ids, wrapt.FunctionWrapper)
        assert model.embed_input_ids([3]) == [6] and not WORKER.pending
        instrumentor.instrument()
        assert model.embed_input_ids([3]) == [6]
        assert counts(WORKER) == {stages.EMBED_INPUT_IDS: 1}
    finally:
        instrumentor.uninstrument()
    assert model.embed_input_ids([4]) == [8] and not WORKER.pending


class LoadingRunner:
    def load_model(self):
        self.model = Model()
        return "loaded"


def test_the_model_loaded_hook_wraps_the_models_embed_input_ids():
    hook = Hook("test.load_model", f"{__name__}:LoadingRunner.load_model", (),
                worker_stages.model_loaded, "ranges", "worker")
    patching.Table([hook], switches={})  # the worker names its runner from the hook's table
    hook.apply()
    try:
        runner = LoadingRunner()
        assert runner.load_model() == "loaded"
        assert runner.model.embed_input_ids([5], [[0.5]], is_multimodal=[True]) == [10]
        assert counts(WORKER) == {stages.EMBED_INPUT_IDS: 1}
        # a step without multimodal embeddings: no sample
        assert runner.model.embed_input_ids([5]) == [10] and not WORKER.pending
        assert runner.model.embed_input_ids([5], multimodal_embeddings=[]) == [10]
        assert not WORKER.pending
    finally:
        hook.revert()
        patching.unwrap_instances()


def test_a_failing_record_turns_the_stage_hook_off_and_vllm_goes_on(caplog):
    """Our bug inside a stage timer (here: a collector whose bucket is no list) costs the stage
    its hook, after one warning; vLLM's result, and vLLM's own error, stay vLLM's."""
    hook = Hook("ranges.gather_mm_embeddings", f"{__name__}:Runner._gather_mm_embeddings",
                ("shift_computed_tokens",), worker_stages.gather_mm_embeddings, "ranges",
                "worker")
    original = Runner.__dict__["_gather_mm_embeddings"]
    hook.apply()
    WORKER.durations[stages.GATHER_MM_EMBEDDINGS] = "not a list"  # our bug, not vLLM's
    try:
        with caplog.at_level(logging.WARNING, logger="vllm.mmscope"):
            with pytest.raises(ValueError, match="vLLM's own error"):
                Runner()._gather_mm_embeddings(-1)
            assert Runner()._gather_mm_embeddings(4) == ([1] * 4, "mask")
            assert Runner()._gather_mm_embeddings(5) == ([1] * 5, "mask")
        assert Runner.__dict__["_gather_mm_embeddings"] is original
        ours = [r.getMessage() for r in caplog.records if r.name == "vllm.mmscope"]
        assert len(ours) == 1 and ours[0].startswith(
            "mmscope: hook ranges.gather_mm_embeddings raised AttributeError")
    finally:
        hook.revert()
        WORKER.durations.pop(stages.GATHER_MM_EMBEDDINGS, None)


class Connector:  # the parts of vLLM's ECConnectorBase the wrapper reads
    def __init__(self, role, producer, consumer):
        self.role, self.is_producer, self.is_consumer = role, producer, consumer
        self.loaded, self.saved = [], []

    def start_load_caches(self, encoder_cache, **kwargs):
        self.loaded.append(sorted(encoder_cache))

    def save_caches(self, encoder_cache, mm_hash, **kwargs):
        self.saved.append(mm_hash)


class ConnectorFactory:  # ECConnectorFactory.create_connector's signature
    @classmethod
    def create_connector(cls, config, role):
        return Connector(role, *config)


@pytest.mark.parametrize("producer,consumer", [(True, False), (False, True), (True, True)])
def test_the_worker_side_ec_connector_gets_its_load_and_save_ranges(producer, consumer):
    from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole

    hook = Hook("test.ec_connector", f"{__name__}:ConnectorFactory.create_connector",
                ("role",), worker_stages.connector_created, "ranges", "worker")
    hook.apply()
    try:
        scheduler_side = ConnectorFactory.create_connector((True, True), ECConnectorRole.SCHEDULER)
        connector = ConnectorFactory.create_connector((producer, consumer), ECConnectorRole.WORKER)
    finally:
        hook.revert()
    for side in (scheduler_side, connector):
        side.start_load_caches({"h1": None})
        side.save_caches({"h1": None}, "h1")
    assert connector.loaded == [["h1"]] and connector.saved == ["h1"]  # vLLM's work, unchanged
    expected = {}
    if consumer:
        expected[stages.EC_LOAD] = 1
    if producer:
        expected[stages.EC_SAVE] = 1
    assert counts(WORKER) == expected  # the scheduler's connector moves no data: no range
    patching.unwrap_instances()
    connector.start_load_caches({})
    connector.save_caches({}, "h2")
    assert not WORKER.pending
