"""The stage wrappers' two roads: timed in C while tracing is off, in Python (spans and timing)
while it is on. Both must record the same stages, keep vLLM's results and exceptions, and trace."""
from __future__ import annotations

import contextlib
import inspect
import sys
from unittest.mock import ANY

import pytest

from mmscope import stages
from mmscope.emit import tracing
from mmscope.emit.stage_timer import FRONTEND, WORKER
from mmscope.vllm import patching, ranges
from tests.kit import traces as tk


@pytest.fixture(autouse=True)
def wrappers(wrapper_road):
    WORKER.drain(), FRONTEND.drain()
    yield wrapper_road
    WORKER.drain(), FRONTEND.drain()
    tracing.configure("off")


class Runner:
    def gather(self, x, scale=1):
        if x < 0:
            raise ValueError("vLLM's own error")
        return x * scale


class Timing:  # vLLM's TimingContext: record(stage) is a generator context manager
    def __init__(self):
        self.seen = []

    @contextlib.contextmanager
    def record(self, stage):
        self.seen.append(stage)
        yield "block"


def test_a_timed_method_records_once_per_call_and_keeps_results_and_errors(wrappers):
    state = patching.HookState("test.timed")
    timed = ranges.timed_method(Runner.gather, stages.GATHER_MM_EMBEDDINGS, state)
    assert (type(timed).__name__ == "Wrapper") == (wrappers == "c")
    assert timed(Runner(), 3, scale=2) == 6
    with pytest.raises(ValueError, match="vLLM's own error"):
        timed(Runner(), -1)
    durations = WORKER.drain()[stages.GATHER_MM_EMBEDDINGS]
    assert len(durations) == 2 and all(d > 0 for d in durations)  # the failed call too
    assert state.enabled


def test_a_timed_method_is_a_traced_range_while_tracing(tmp_path):
    timed = ranges.timed_method(Runner.gather, stages.GATHER_MM_EMBEDDINGS)
    tracing.configure("chrome", str(tmp_path))
    assert timed(Runner(), 2) == 2
    tracing.flush()
    names = [r.name for r in tk.load(tmp_path)[0]]
    assert names == [stages.GATHER_MM_EMBEDDINGS]
    assert len(WORKER.drain()[stages.GATHER_MM_EMBEDDINGS]) == 1


def test_processor_stages_are_timed_under_their_range_names(wrappers, tmp_path):
    state = patching.HookState("test.processor")
    record = ranges.processor_stage_ranged(Timing.record, state)
    timing = Timing()
    for _ in range(2):  # the first call names the stage (Python), the next are timed in C
        with record(timing, "hf_processor") as block:
            assert block == "block"
    with pytest.raises(KeyError):
        with record(timing, "prompt_update"):
            raise KeyError("inside vLLM's block")
    assert timing.seen == ["hf_processor", "hf_processor", "prompt_update"]
    durations = FRONTEND.drain()
    assert {k: len(v) for k, v in durations.items()} == {
        stages.processor_range("hf_processor"): 2, stages.processor_range("prompt_update"): 1}
    assert state.enabled
    tracing.configure("chrome", str(tmp_path))  # traced: spans as well as durations
    with record(timing, "hf_processor"):
        pass
    tracing.flush()
    assert [r.name for r in tk.load(tmp_path)[0]] == [stages.processor_range("hf_processor")]
    assert len(FRONTEND.drain()[stages.processor_range("hf_processor")]) == 1


class QuietTiming(Timing):  # vLLM's TimingContext with its own timing off
    enabled = False


def test_with_vllm_timing_off_the_stage_timer_stands_in_for_its_no_op_block(wrappers):
    state = patching.HookState("test.processor")
    record = ranges.processor_stage_ranged(Timing.record, state)
    timing = QuietTiming()
    for _ in range(2):  # the Python road names the stage, then C
        with record(timing, "hf_processor") as block:
            assert block is None  # what vLLM's disabled record() yields
    with pytest.raises(KeyError, match="inside vLLM's block"):
        with record(timing, "hf_processor"):
            raise KeyError("inside vLLM's block")
    assert timing.seen == []  # vLLM's no-op context manager was never built
    assert len(FRONTEND.drain()[stages.processor_range("hf_processor")]) == 3
    assert state.enabled


@pytest.mark.parametrize("vllm_timing", [True, False])
def test_vllm_timing_context_keeps_its_own_figures_under_the_stage_timer(wrappers, vllm_timing):
    from vllm.multimodal.processing.context import TimingContext

    # vLLM's own record(), even where an engine of an earlier test left the class instrumented
    original = TimingContext.record
    while getattr(original, "__mmscope_hook__", None):
        original = original.__wrapped__
    record = ranges.processor_stage_ranged(original, patching.HookState("test.t"))
    timing = TimingContext(enabled=vllm_timing)
    if not vllm_timing:  # the premise of the stand-in: vLLM's record() then does nothing
        with original(timing, "get_mm_hashes") as block:
            assert block is None
        assert timing.stage_secs == {}
    for stage in ("get_mm_hashes", "apply_hf_processor", "apply_hf_processor"):
        with record(timing, stage):
            sum(range(1000))
    with pytest.raises(ValueError):
        with record(timing, "apply_prompt_updates"):
            raise ValueError("vLLM's own error")
    stage_names = ["get_mm_hashes", "apply_hf_processor", "apply_prompt_updates"]
    if vllm_timing:  # vLLM's own figures, as without mmscope (the failed block counted too)
        assert sorted(timing.stage_secs) == sorted(stage_names)
        assert all(s > 0 for s in timing.stage_secs.values())
    else:
        assert timing.stage_secs == {}
    durations = FRONTEND.drain()
    assert {k: len(v) for k, v in durations.items()} == {
        stages.processor_range("get_mm_hashes"): 1, stages.processor_range("apply_hf_processor"): 2,
        stages.processor_range("apply_prompt_updates"): 1}


class ModelRunner:  # vLLM's GPUModelRunner.timed_encoder_operation: a context manager
    @contextlib.contextmanager
    def timed_encoder_operation(self, should_time, group_lora_refs, current_item_idx, num_items):
        yield


def test_the_encoder_forward_is_one_vit_forward_range_per_encoder_batch(wrappers, tmp_path):
    state = patching.HookState("test.vit")
    forward = ranges.encoder_forward_ranged(ModelRunner.timed_encoder_operation, state)
    assert (type(forward).__name__ == "Wrapper") == (wrappers == "c")
    for should_time in (False, True):
        with forward(ModelRunner(), should_time, None, 0, 1):
            pass
    with pytest.raises(RuntimeError, match="encoder failed"):
        with forward(ModelRunner(), False, None, 1, 1):
            raise RuntimeError("encoder failed")  # vLLM's own error inside the block
    assert len(WORKER.drain()[stages.VIT_FORWARD]) == 3 and state.enabled
    tracing.configure("chrome", str(tmp_path))
    with forward(ModelRunner(), False, None, 0, 1):
        pass
    tracing.flush()
    assert [r.name for r in tk.load(tmp_path)[0]] == [stages.VIT_FORWARD]


def test_a_full_stage_counts_drops_instead_of_growing():
    from mmscope.emit.stage_timer import MAX_PER_STAGE

    timed = ranges.timed_method(Runner.gather, stages.GATHER_MM_EMBEDDINGS)
    WORKER.durations[stages.GATHER_MM_EMBEDDINGS] = [1] * MAX_PER_STAGE
    dropped = WORKER.dropped
    assert timed(Runner(), 1) == 1
    assert len(WORKER.durations[stages.GATHER_MM_EMBEDDINGS]) == MAX_PER_STAGE
    assert WORKER.dropped == dropped + 1


def test_a_failing_record_turns_the_stage_hook_off_and_vllm_goes_on():
    WORKER.durations[stages.GATHER_MM_EMBEDDINGS] = "not a list"  # our bug, not vLLM's
    state = patching.HookState("test.broken")
    timed = ranges.timed_method(Runner.gather, stages.GATHER_MM_EMBEDDINGS, state)
    assert timed(Runner(), 4) == 4 and timed(Runner(), 5) == 5
    assert not state.enabled and "AttributeError" in state.error


def test_instance_methods_are_unwrapped_and_wrapped_again_with_the_hooks():
    class Model:
        def embed_input_ids(self, ids):
            return [i * 2 for i in ids]

    model = Model()
    ranges._wrap_instance_method(model, "embed_input_ids", stages.EMBED_INPUT_IDS)
    assert model.embed_input_ids([1, 2]) == [2, 4]
    assert len(WORKER.drain()[stages.EMBED_INPUT_IDS]) == 1
    ranges.unwrap_instances()  # what uninstrument() does
    assert model.embed_input_ids([3]) == [6] and not WORKER.pending
    assert not hasattr(model.embed_input_ids, "__mmscope_range__")
    ranges.rewrap_instances()  # what instrument() does
    assert model.embed_input_ids([3]) == [6] and len(WORKER.drain()[stages.EMBED_INPUT_IDS]) == 1
    ranges.unwrap_instances()


def test_hash_ranges_name_each_branch_on_vllms_hasher(tmp_path, wrappers):
    """The hash wrapper names a range after the branch serialize_item takes, remembering the
    answer per item type only where the type decides it (MediaWithBytes: the wrapped media)."""
    import numpy as np
    from PIL import Image
    from vllm.multimodal.hasher import MultiModalHasher
    from vllm.multimodal.media import MediaWithBytes

    # vLLM's own function, also where an engine test of this process left mmscope's hook on it.
    original = inspect.unwrap(MultiModalHasher.__dict__["hash_kwargs"].__func__)
    state = patching.HookState("test.hash")
    hashed = classmethod(ranges.hash_kwargs_ranged(original, state)).__get__(None, MultiModalHasher)
    picture = Image.new("RGB", (8, 8), "red")
    calls = [({"image": picture}, "pil_image"), ({"image": picture}, "pil_image"),
             ({"image": MediaWithBytes(picture, b"png")}, "image_bytes"),
             ({"image": MediaWithBytes(np.zeros((2, 4, 4, 3), np.uint8), b"mp4")}, "video"),
             ({"image": MediaWithBytes(picture, b"png")}, "image_bytes"),
             ({"image": b"raw", "model_id": "m"}, "bytes"),
             ({"image": picture, "video": b"raw"}, "mixed")]
    for kwargs, _ in calls:
        assert hashed("sha256", **kwargs) == original(MultiModalHasher, "sha256", **kwargs)
    names = [stages.hash_range(branch) for _, branch in calls]
    durations = FRONTEND.drain()
    assert sorted(n for n in durations for _ in durations[n]) == sorted(names)
    assert state.enabled
    if wrappers == "c":  # an item of a type already named takes the C road: no frame of ours
        ours = []
        sys.setprofile(lambda frame, event, arg: ours.append(frame.f_code.co_name)
                       if event == "call" and frame.f_code.co_filename == ranges.__file__ else None)
        try:
            hashed("sha256", image=picture)
        finally:
            sys.setprofile(None)
        assert ours == [] and FRONTEND.drain() == {stages.hash_range("pil_image"): [ANY]}
