"""What the range hooks observe: the stage boundaries of vLLM's multimodal pipeline (DESIGN §3).

Each wrapper opens one catalogued range around exactly the vLLM call it names, and times it.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import time
import weakref

from mmscope import stages
from mmscope.emit import tracing
from mmscope.emit import step_shape as telemetry_module
from mmscope.emit.stage_timer import ENABLED as STAGE_METRICS
from mmscope.emit.stage_timer import FRONTEND, MAX_PER_STAGE, WORKER, timed_stage
from mmscope.emit.step_shape import StepTelemetry, split_prefill_decode
from mmscope.vllm.patching import PY_ONLY, HookState, native_wrapper

try:  # built by pip install (setup.py); optional: step_shape_seen does the same in Python
    from mmscope.vllm import _step_telemetry as _native_steps
except ImportError:
    _native_steps = None
if PY_ONLY:
    _native_steps = None

# --- API server: hashing and processor stages --------------------------------------------------
NOT_ITEMS = frozenset({"model_id", "media_io_kwargs", "mm_processor_kwargs", "mm_hash"})


@functools.cache
def _hash_types():
    # Imported once, on first use: this runs for every hashed item in the API server.
    import numpy as np
    import torch
    from PIL import Image
    from vllm.multimodal.media import MediaWithBytes

    return np.ndarray, torch.Tensor, Image.Image, MediaWithBytes


def hash_branch(obj) -> str:
    """The MultiModalHasher.serialize_item branch that serializes `obj` (vLLM 0.32's order)."""
    ndarray, tensor, image, media_with_bytes = _hash_types()
    if isinstance(obj, (bytes, memoryview)):
        return "bytes"
    if isinstance(obj, str):
        return "str"
    if isinstance(obj, (int, float)):
        return "number"
    if isinstance(obj, image):
        return "pil_image"
    if isinstance(obj, media_with_bytes):
        return "image_bytes" if isinstance(obj.media, image) else "video"
    if isinstance(obj, tensor):
        return "tensor"
    if isinstance(obj, ndarray):
        return "ndarray"
    return "pickle"


def hash_kwargs_ranged(original, state: HookState):
    """One `mm:hash:<branch>` range per hashed item. hash_kwargs consumes serialize_item's lazy
    byte generator before it returns, so the range covers the serialization, not just the call.
    In C (TIMED_BY_ITEM) for an item whose type this Python wrapper has already named."""
    now, record = time.perf_counter_ns, FRONTEND.record
    mixed = stages.hash_range("mixed")
    by_type: dict[type, str] = {}  # item type -> range name, where the type alone decides

    @functools.wraps(original)
    def wrapper(cls, algorithm, /, **kwargs):
        if not state.enabled:
            return original(cls, algorithm, **kwargs)
        try:  # inline: this runs for every hashed item, and each Python frame costs here
            item, n = None, 0
            for key in kwargs:
                if key not in NOT_ITEMS:
                    item, n = kwargs[key], n + 1
            name = mixed if n != 1 else by_type.get(type(item))
            if name is None:
                name = stages.hash_range(hash_branch(item))
                if branch_by_type(item):
                    by_type[type(item)] = name
        except Exception as e:  # noqa: BLE001
            state.failed(e)
            return original(cls, algorithm, **kwargs)
        if tracing.on:
            with timed_stage(name, FRONTEND):
                return original(cls, algorithm, **kwargs)
        t0 = now()
        try:
            return original(cls, algorithm, **kwargs)
        finally:
            if STAGE_METRICS:
                record(name, now() - t0)

    native = native_wrapper(original, record, state, "TIMED_BY_ITEM", name=by_type, slow=wrapper,
                            switch=tracing, store=FRONTEND.durations, limit=MAX_PER_STAGE,
                            not_items=NOT_ITEMS) if STAGE_METRICS else None
    return native or wrapper


def branch_by_type(obj) -> bool:
    """Whether hash_branch(obj) follows from type(obj) alone (not for MediaWithBytes, whose
    branch depends on the media it wraps)."""
    return not isinstance(obj, _hash_types()[3])


def processor_stage_ranged(original, state: HookState):
    """TimingContext.record(stage) is entered for every processor stage, timing on or off. The C
    wrapper (RANGED_CM) times and traces the block once this Python one has named the stage.
    With vLLM's own timing off (`enabled` false, the default) its record() is a no-op generator
    context manager, about 1 us a stage: ours then stands in for it rather than nesting it."""
    names: dict[str, str] = {}  # vLLM stage -> range name, filled by the Python road

    @functools.wraps(original)
    def wrapper(self, stage, *args, **kwargs):
        if not state.enabled:
            return original(self, stage, *args, **kwargs)
        cm = original(self, stage, *args, **kwargs) if getattr(self, "enabled", True) else None
        name = names.get(stage)
        if name is None:
            name = names[stage] = stages.processor_range(stage)
        return _RangedCM(name, cm, FRONTEND)

    native = native_wrapper(original, FRONTEND.record, state, "RANGED_CM", name=names,
                            slow=wrapper, switch=tracing, store=FRONTEND.durations,
                            limit=MAX_PER_STAGE, noop_unless="enabled") if STAGE_METRICS else None
    return native or wrapper


class _RangedCM:
    """A timed stage around another context manager, or standing in for a no-op one (cm None);
    a class: cheaper than @contextmanager. The span and the duration are inlined: this runs
    several times per request."""

    __slots__ = ("name", "cm", "collector", "span", "t0")

    def __init__(self, name, cm, collector):
        self.name, self.cm, self.collector = name, cm, collector
        self.span = tracing.span_factory()(name) if tracing.on else None

    def __enter__(self):
        if self.span is not None:
            self.span.__enter__()
        self.t0 = time.perf_counter_ns()
        if self.cm is None:
            return None  # what vLLM's no-op block yields
        try:
            return self.cm.__enter__()
        except BaseException:
            self._close(None, None, None)
            raise

    def __exit__(self, exc_type, exc, tb):
        if self.cm is None:
            self._close(exc_type, exc, tb)
            return False
        try:
            return self.cm.__exit__(exc_type, exc, tb)
        finally:
            self._close(exc_type, exc, tb)

    def _close(self, exc_type, exc, tb):
        elapsed = time.perf_counter_ns() - self.t0
        if self.span is not None:
            self.span.__exit__(exc_type, exc, tb)
        if STAGE_METRICS:
            self.collector.record(self.name, elapsed)


# --- worker: siblings under `gpu_model_runner: preprocess` -------------------------------------
def encoder_forward_ranged(original, state: HookState):
    """timed_encoder_operation wraps exactly model.embed_multimodal per encoder batch; wrapping
    _execute_mm_encoder instead would also swallow the EC save loop (the seed's bug)."""

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        cm = original(*args, **kwargs)
        return _RangedCM(stages.VIT_FORWARD, cm, WORKER) if state.enabled else cm

    # In C (RANGED_CM), which names the block by the call's first argument: here should_time,
    # and either value names vit_forward.
    names = {True: stages.VIT_FORWARD, False: stages.VIT_FORWARD}
    native = native_wrapper(original, WORKER.record, state, "RANGED_CM", name=names, slow=wrapper,
                            switch=tracing, store=WORKER.durations,
                            limit=MAX_PER_STAGE) if STAGE_METRICS else None
    return native or wrapper


def timed_method(original, name: str, state: HookState | None = None):
    """`original` wrapped whole in one worker stage: a span while tracing, and its duration for
    the histograms. Runs several times per step, so the C wrapper (TIMED) does it where built."""
    now, record = time.perf_counter_ns, WORKER.record
    state = state or HookState(f"ranges.{name}")

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if not state.enabled:
            return original(*args, **kwargs)
        if tracing.on:
            with timed_stage(name, WORKER):
                return original(*args, **kwargs)
        if not STAGE_METRICS:
            return original(*args, **kwargs)
        t0 = now()
        try:
            return original(*args, **kwargs)
        finally:
            try:
                record(name, now() - t0)
            except Exception as e:  # noqa: BLE001 - ours: the hook turns off, vLLM goes on
                state.failed(e)

    native = native_wrapper(original, record, state, "TIMED", name=name, switch=tracing,
                            store=WORKER.durations, limit=MAX_PER_STAGE) if STAGE_METRICS else None
    return native or wrapper


def ranged_method(name: str):
    """A hook factory: the method wrapped whole in one range (timed_method)."""
    return lambda original, state: timed_method(original, name, state)


# Instance methods wrapped at run time (the model's, the EC connector's): uninstrument() puts the
# originals back and instrument() wraps them again, like the class-level hooks.
_instance_wraps: list[tuple[weakref.ref, str, str]] = []


def _wrap_instance_method(obj, attr: str, name: str) -> None:
    method = getattr(obj, attr, None)
    if method is None or getattr(method, "__mmscope_range__", None) == name:
        return
    ranged = timed_method(method, name)
    ranged.__mmscope_range__ = name
    setattr(obj, attr, ranged)
    try:
        ref = weakref.ref(obj)
    except TypeError:
        return  # not weak-referenceable: it stays wrapped for its life
    if not any(r() is obj and a == attr for r, a, _ in _instance_wraps):
        _instance_wraps.append((ref, attr, name))


def unwrap_instances() -> None:
    """Put the original instance methods back (each wrapper keeps it under __wrapped__)."""
    for ref, attr, _ in _instance_wraps:
        obj = ref()
        method = getattr(obj, attr, None) if obj is not None else None
        if getattr(method, "__mmscope_range__", None):
            setattr(obj, attr, method.__wrapped__)


def rewrap_instances() -> None:
    _instance_wraps[:] = [w for w in _instance_wraps if w[0]() is not None]
    for ref, attr, name in list(_instance_wraps):
        _wrap_instance_method(ref(), attr, name)


def connector_created(connector, cls, config, role, *args, **kwargs) -> None:
    """EC connectors differ by class, so the worker-side instance gets the load/save ranges:
    start_load_caches includes the host-to-device copy, save_caches the device-to-host one."""
    from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole

    if role != ECConnectorRole.WORKER:
        return
    if getattr(connector, "is_consumer", False):
        _wrap_instance_method(connector, "start_load_caches", stages.EC_LOAD)
    if getattr(connector, "is_producer", False):
        _wrap_instance_method(connector, "save_caches", stages.EC_SAVE)


def model_loaded(result, runner, *args, **kwargs) -> None:
    """embed_input_ids is a method of the model, which exists only once the runner loaded it."""
    model = getattr(runner, "model", None)
    if model is not None:
        _wrap_instance_method(model, "embed_input_ids", stages.EMBED_INPUT_IDS)


# --- worker: step telemetry --------------------------------------------------------------------
STEP_LOGGER = "vllm.mmscope.step_tokens"
_step_telemetry: StepTelemetry | None = None
_is_first_tp_rank: bool | None = None


def _first_tp_rank() -> bool:
    global _is_first_tp_rank
    if _is_first_tp_rank is None:
        try:
            from vllm.distributed.parallel_state import get_tp_group
            _is_first_tp_rank = get_tp_group().rank_in_group == 0
        except Exception:  # noqa: BLE001 - not initialised (unit use): behave as rank 0
            return True
    return _is_first_tp_rank


def batch_shape(runner, num_scheduled_tokens) -> stages.StepShape:
    """The step's shape: the persistent batch's first num_reqs rows are the step's requests."""
    batch = runner.input_batch
    n = batch.num_reqs
    return split_prefill_decode(num_scheduled_tokens[:n], batch.num_computed_tokens_cpu[:n],
                                batch.num_prompt_tokens[:n])


def step_shape_seen(runner, scheduler_output, num_scheduled_tokens, *args, **kwargs) -> None:
    """The Python step observer (the C one's reference and fallback)."""
    global _step_telemetry
    telemetry = _step_telemetry
    if telemetry is None:
        telemetry = _step_telemetry = StepTelemetry(logging.getLogger(STEP_LOGGER),
                                                    emit_log=_first_tp_rank())
    level = telemetry.next_step()
    if level is not None:  # a range or a log line needs the step's shape: most steps neither
        telemetry.emit(batch_shape(runner, num_scheduled_tokens), level)


@functools.cache
def step_observer():
    """The telemetry hook's observer, one per process (its step counter spans engines and
    instrument() calls): the C observer where it was built, else step_shape_seen."""
    if _native_steps is None:
        return step_shape_seen
    return _native_steps.StepObserver(
        logging.getLogger(STEP_LOGGER), _first_tp_rank, tracing, telemetry_module.INFO_EVERY,
        stages.STEP_META_FORMAT, telemetry_module.STEP_TOKENS_FORMAT, batch_shape)


def worker_timings_attached(original, state: HookState):
    """Worker stage durations ride to EngineCore on the step's ModelRunnerOutput (pickled whole
    between processes, so an extra attribute survives). Where the scheduler runs in this same
    process it takes them from WORKER itself (encoder_cache.attach_stats), and the hook retires.
    vLLM's shared empty output is never written to: the durations wait for the next real one."""

    @functools.wraps(original)
    def wrapper(runner, *args, **kwargs):
        output = original(runner, *args, **kwargs)
        if not state.enabled:
            return output
        if WORKER.collected_in_process:
            state.retire("the scheduler shares this process and takes the durations itself")
        elif WORKER.pending and output is not None and hasattr(output, "__dict__") \
                and output is not _empty_output():
            output._mmscope_stage_durations = WORKER.drain()
        return output
    return wrapper


@functools.cache
def _empty_output():
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT
    return EMPTY_MODEL_RUNNER_OUTPUT


# --- vLLM's own ranges into mmscope's backends -------------------------------------------------
def route_vllm_ranges() -> bool:
    """vLLM opens its step ranges through record_function_or_nullcontext, which calls the cached
    `_PROFILER_FUNC`. When mmscope traces, point it at our span (keeping NVTX/torch behaviour), so
    the chrome trace holds `gpu_model_runner: preprocess/forward/...` around our ranges."""
    if not tracing.active():
        return False
    import vllm.envs as envs
    import vllm.v1.utils as vutils

    inner = None
    if envs.VLLM_CUSTOM_SCOPES_FOR_PROFILING:
        from torch.autograd.profiler import record_function as inner
    # VLLM_NVTX_SCOPES_FOR_PROFILING: our `nvtx` backend already emits the NVTX range.
    vutils._PROFILER_FUNC = _combined(inner) if inner else tracing.span_factory()
    return True


def _combined(inner):
    @contextlib.contextmanager
    def both(name):
        with tracing.span(name), inner(name):
            yield
    return both
