"""Worker wrappers of both model runners: the disjoint siblings under `gpu_model_runner: preprocess`
(docs/design.md §3), each a range while tracing and a duration sample for the stage histogram.
"""
from __future__ import annotations

from mmscope import stages
from mmscope.emit import device_events, tracing
from mmscope.emit.stage_timer import ENABLED, WORKER, timed_stage
from mmscope.vllm import runners
from mmscope.vllm.worker import ec_connector
from mmscope.vllm.patching import wrap_instance


def timed(name: str, multimodal=None, skip=None):
    """A wrapper timing the whole call as one worker stage (a span too while tracing). With
    `multimodal(result, *params)`, a call of a step without multimodal embeddings (a decode step)
    gives no histogram sample: the stage describes multimodal work. `skip(*params)`: calls that
    are not the stage at all (no span, no sample). `params`: the row's, bound by name. One frame:
    these run in every engine step."""
    def wrapper(hook, wrapped, instance, args, kwargs, *params):
        if skip is not None and skip(*params):
            return wrapped(*args, **kwargs)
        span = tracing.span(name) if tracing.on else None
        if span is not None:
            span.__enter__()
        started = WORKER.clock.start()
        try:
            result = wrapped(*args, **kwargs)
        finally:
            if span is not None:
                span.__exit__(None, None, None)
        try:
            if ENABLED and (multimodal is None or multimodal(result, *params)):
                WORKER.clock.stop(WORKER, name, started)
        except Exception as e:  # noqa: BLE001 - ours: the hook turns off, vLLM goes on
            hook.failed(e)
        return result
    return wrapper


# --- the encoder forward --------------------------------------------------------------------
def encoder_forward(hook, wrapped, runner, args, kwargs):
    """V1: timed_encoder_operation wraps exactly model.embed_multimodal per encoder batch;
    wrapping _execute_mm_encoder instead would also swallow the EC save loop, which vit_forward
    never contains (docs/design.md §6, the checks)."""
    return timed_stage(stages.VIT_FORWARD, WORKER, wrapped(*args, **kwargs))


# V2 runs all of a step's encoder batches inside one timed_encoder_operation, and its warm-up
# (profile_encoder_cache) runs them outside any: the batches inside one are the stage.
_encoding = False


class _EncoderStep:
    """V2's timed_encoder_operation(request_ids), observed: its batches are vit_forward."""

    __slots__ = ("inner",)

    def __init__(self, inner):
        self.inner = inner

    def __enter__(self):
        global _encoding
        result = self.inner.__enter__()
        _encoding = True
        return result

    def __exit__(self, exc_type, exc, tb):
        global _encoding
        _encoding = False
        return self.inner.__exit__(exc_type, exc, tb)


def encoder_step(hook, wrapped, encoder_runner, args, kwargs):
    return _EncoderStep(wrapped(*args, **kwargs))


_batch = timed(stages.VIT_FORWARD)


def encoder_batch(hook, wrapped, instance, args, kwargs):
    """One encoder batch of a step: the model's embed_multimodal, or the encoder's CUDA graph
    (EncoderCudaGraphManager.execute), whose eager road for a batch beyond its budgets calls
    embed_multimodal in turn (vLLM 0.34's Pixtral): that inner call is no second batch."""
    global _encoding
    if not _encoding:
        return wrapped(*args, **kwargs)
    _encoding = False
    try:
        return _batch(hook, wrapped, instance, args, kwargs)
    finally:
        _encoding = True


# --- gather, embed, prepare ---------------------------------------------------------------------
# Whether this step's gather found multimodal embeddings: V1's _preprocess gathers before it
# prepares the inputs, on the same thread, so the prepare stage reads (and clears) it. None: no
# gather since the last prepare, as in V1's dummy runs (warm-up, profiling, graph capture), which
# prepare inputs outside any step.
_step_gathered: bool | None = None


def _gathered(result, *lookahead) -> bool:
    global _step_gathered
    _step_gathered = bool(result[0])  # (mm_embeds, is_mm_embed): the step's gathered embeddings
    return _step_gathered


def _merged(result, multimodal_embeddings) -> bool:
    return bool(multimodal_embeddings is not None and len(multimodal_embeddings))


def _prepared(result) -> bool:
    global _step_gathered
    gathered, _step_gathered = _step_gathered, None
    return gathered


def _dummy_run() -> bool:
    """Inputs prepared with no gather before them: a dummy run, no step (no range, no sample)."""
    return _step_gathered is None


def _drafter(*lookahead) -> bool:
    """The drafter gathers ahead (speculative decoding: V1's shift_computed_tokens, V2's
    draft_lookahead): not the step's stage."""
    return bool(lookahead and lookahead[0])


# Every runner's gather; its row's param is V1's shift_computed_tokens, V2's draft_lookahead,
# none for V2's standalone CPU runner, which has no drafter.
gather_mm_embeddings = timed(stages.GATHER_MM_EMBEDDINGS, _gathered, skip=_drafter)
prepare_mm_inputs = timed(stages.PREPARE_MM_INPUTS, _prepared, skip=_dummy_run)
_embed_timed = timed(stages.EMBED_INPUT_IDS, _merged)


def model_loaded(hook, wrapped, runner, args, kwargs):
    """The model exists once the runner loaded it: its embed_input_ids (and, under V2, its
    embed_multimodal, one encoder batch) are wrapped on the instance; an accelerator's stages are
    timed with its events from then on; the worker names its runner once."""
    result = wrapped(*args, **kwargs)
    try:
        model = getattr(runner, "model", None)
        if model is not None:
            wrap_instance(model, "embed_input_ids", _embed_timed, hook, ("multimodal_embeddings",))
            if runners.is_v2(hook.runner):
                wrap_instance(model, "embed_multimodal", encoder_batch, hook)
        _time_on_device(getattr(runner, "device", None))
        runners.announce(runner, hook.table)
    except Exception as e:  # noqa: BLE001 - ours: the hook turns off, vLLM goes on
        hook.failed(e)
    return result


def _time_on_device(device) -> None:
    """On an accelerator, a stage's work runs after its call returns: sample it from events."""
    if device is None or getattr(device, "type", "cpu") == "cpu":
        return
    WORKER.use_device_events(device_events.clock(device))


def connector_created(hook, wrapped, cls, args, kwargs, role):
    """The worker-side EC connector's load and save are timed and counted (worker/ec_connector.py):
    start_load_caches includes the host-to-device copy, save_caches the device-to-host one."""
    connector = wrapped(*args, **kwargs)
    try:
        from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole

        if role == ECConnectorRole.WORKER:
            if connector.is_consumer:
                wrap_instance(connector, "start_load_caches", ec_connector.load_wrapper, hook,
                              ec_connector.LOAD_PARAMS)
            if connector.is_producer:
                wrap_instance(connector, "save_caches", ec_connector.save_wrapper, hook,
                              ec_connector.SAVE_PARAMS)
    except Exception as e:  # noqa: BLE001
        hook.failed(e)
    return connector
