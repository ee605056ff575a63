"""Worker wrappers: the disjoint siblings under `gpu_model_runner: preprocess` (docs/design.md §3), the
step's shape, and the stage durations sent to EngineCore.
"""
from __future__ import annotations

import functools
import time
import weakref

import wrapt

from mmscope import stages
from mmscope.emit import tracing
from mmscope.emit.stage_timer import ENABLED, WORKER, timed_stage
from mmscope.emit.step_shape import StepTelemetry, split_prefill_decode
from mmscope.log import logger
from mmscope.vllm import ec_connector
from mmscope.vllm.ec_connector import TRANSFERS
from mmscope.vllm.patching import failed, retire
from mmscope.vllm.scheduler import SENT_DURATIONS


def encoder_forward(wrapped, runner, args, kwargs):
    """timed_encoder_operation wraps exactly model.embed_multimodal per encoder batch; wrapping
    _execute_mm_encoder instead would also swallow the EC save loop (the seed's bug)."""
    return timed_stage(stages.VIT_FORWARD, WORKER, wrapped(*args, **kwargs))


def timed(name: str, multimodal=None, hook: str | None = None):
    """A wrapper timing the whole call as one worker stage (a span too while tracing). With
    `multimodal(result, args, kwargs)`, a call of a step without multimodal embeddings (a decode
    step) gives no histogram sample: the stage describes multimodal work. `hook`: the table's
    hook that an error of ours turns off."""
    def _timed_call(wrapped, args, kwargs):
        t0 = time.perf_counter_ns()
        result = wrapped(*args, **kwargs)
        try:
            if ENABLED and (multimodal is None or multimodal(result, args, kwargs)):
                WORKER.record(name, time.perf_counter_ns() - t0)
        except Exception as e:  # noqa: BLE001 - ours: the hook turns off, vLLM goes on
            failed(hook or f"ranges.{name}", e)
        return result
    return tracing.spanned(name, _timed_call)


# Whether this step's gather found multimodal embeddings: vLLM's _preprocess gathers before it
# prepares the inputs, on the same thread, so the prepare stage reads (and clears) it.
_step_gathered = False


def _gathered(result, args, kwargs) -> bool:
    global _step_gathered
    _step_gathered = bool(result[0])  # (mm_embeds, is_mm_embed): the step's gathered embeddings
    return _step_gathered


def _merged(result, args, kwargs) -> bool:
    embeddings = kwargs.get("multimodal_embeddings", args[1] if len(args) > 1 else None)
    return bool(embeddings is not None and len(embeddings))


def _prepared(result, args, kwargs) -> bool:
    global _step_gathered
    gathered, _step_gathered = _step_gathered, False
    return gathered


gather_mm_embeddings = timed(stages.GATHER_MM_EMBEDDINGS, _gathered, "ranges.gather_mm_embeddings")
prepare_mm_inputs = timed(stages.PREPARE_MM_INPUTS, _prepared, "ranges.prepare_mm_inputs")


# --- instance methods, wrapped once their object exists ----------------------------------------
# The model's embed_input_ids and the EC connector's load/save differ by class, so their instances
# are wrapped when made; uninstrument() unwraps them and instrument() wraps them again.
_instance_wraps: list[tuple] = []  # (weak reference, attribute, wrapt wrapper)


def wrap_instance(obj, attr: str, wrapper) -> None:
    if isinstance(getattr(obj, attr, None), wrapt.FunctionWrapper):
        return
    wrapt.wrap_function_wrapper(obj, attr, wrapper)
    if not any(ref() is obj and a == attr for ref, a, *_ in _instance_wraps):
        _instance_wraps.append((weakref.ref(obj), attr, wrapper))


def unwrap_instances() -> None:
    for ref, attr, *_ in _instance_wraps:
        obj = ref()
        method = getattr(obj, attr, None) if obj is not None else None
        if isinstance(method, wrapt.FunctionWrapper):
            delattr(obj, attr)  # the instance attribute was ours: the class's method shows again


def rewrap_instances() -> None:
    _instance_wraps[:] = [w for w in _instance_wraps if w[0]() is not None]
    for ref, attr, wrapper in list(_instance_wraps):
        wrap_instance(ref(), attr, wrapper)


_embed_timed = timed(stages.EMBED_INPUT_IDS, _merged)


def model_loaded(hook_name: str):
    """embed_input_ids is a method of the model, which exists only once the runner loaded it."""
    def wrapper(wrapped, runner, args, kwargs):
        result = wrapped(*args, **kwargs)
        try:
            if getattr(runner, "model", None) is not None:
                wrap_instance(runner.model, "embed_input_ids", _embed_timed)
        except Exception as e:  # noqa: BLE001 - ours: the hook turns off, vLLM goes on
            failed(hook_name, e)
        return result
    return wrapper


def connector_created(wrapped, cls, args, kwargs):
    """The worker-side EC connector's load and save are timed and counted (vllm/ec_connector.py):
    start_load_caches includes the host-to-device copy, save_caches the device-to-host one."""
    connector = wrapped(*args, **kwargs)
    try:
        from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole

        role = args[1] if len(args) > 1 else kwargs.get("role")
        if role == ECConnectorRole.WORKER:
            if connector.is_consumer:
                wrap_instance(connector, "start_load_caches", ec_connector.load_wrapper)
            if connector.is_producer:
                wrap_instance(connector, "save_caches", ec_connector.save_wrapper)
    except Exception as e:  # noqa: BLE001
        failed(ec_connector.HOOK, e)
    return connector


# --- the step's shape: step_tokens lines and the step_meta range -------------------------------
@functools.cache
def _telemetry() -> StepTelemetry:
    """One per process: its step counter spans engines and instrument() calls."""
    try:
        from vllm.distributed.parallel_state import get_tp_group
        first_rank = get_tp_group().rank_in_group == 0
    except Exception:  # noqa: BLE001 - no tensor-parallel group (a bare runner): rank 0
        first_rank = True
    return StepTelemetry(logger, emit_log=first_rank)


def batch_shape(runner, num_scheduled_tokens) -> stages.StepShape:
    """The persistent batch's first num_reqs rows are the step's requests."""
    batch = runner.input_batch
    n = batch.num_reqs
    return split_prefill_decode(num_scheduled_tokens[:n], batch.num_computed_tokens_cpu[:n],
                                batch.num_prompt_tokens[:n])


def inputs_prepared(wrapped, runner, args, kwargs):
    """_prepare_inputs(scheduler_output, num_scheduled_tokens) runs once per step on the thread
    that runs the forward, just before it: where step_meta belongs."""
    try:
        telemetry = _telemetry()
        level = telemetry.next_step()
        if level is not None:  # a range or a log line needs the shape: most steps neither
            telemetry.emit(batch_shape(runner, args[1]), level)
    except Exception as e:  # noqa: BLE001
        failed("telemetry.step_shape", e)
    return wrapped(*args, **kwargs)


# --- stage durations to EngineCore -------------------------------------------------------------
@functools.cache
def _empty_output():
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT
    return EMPTY_MODEL_RUNNER_OUTPUT


def durations_sent(hook_name: str):
    """Worker stage durations and EC transfer counts ride to EngineCore on the step's
    ModelRunnerOutput. Where the scheduler runs in this same process it takes them from WORKER
    and TRANSFERS itself, so nothing is sent.
    vLLM's shared empty output is never written to: the durations wait for the next real one."""
    def wrapper(wrapped, runner, args, kwargs):
        output = wrapped(*args, **kwargs)
        if WORKER.collected_in_process:
            retire(hook_name, "the scheduler shares this process and takes the durations itself")
        elif (WORKER.pending or TRANSFERS.pending) and output is not None:
            try:
                if hasattr(output, "__dict__") and output is not _empty_output():
                    setattr(output, SENT_DURATIONS, WORKER.drain())
                    setattr(output, ec_connector.SENT_TRANSFERS, TRANSFERS.drain())
            except Exception as e:  # noqa: BLE001
                failed(hook_name, e)
        return output
    return wrapper


# --- vLLM's own step ranges into mmscope's backends --------------------------------------------
def vllm_scope(wrapped, instance, args, kwargs):
    """The model runner opens its step ranges (`gpu_model_runner: preprocess/forward/...`) through
    record_function_or_nullcontext; while mmscope traces, they go through its span, so that every
    backend holds the worker's whole tree (nvtx and torch as vLLM's own switches would)."""
    return tracing.span(args[0]) if tracing.on else wrapped(*args, **kwargs)
