"""The step's shape from either runner: the `step_tokens` lines and the `step_meta` mark, on the
thread that runs the forward, before it (docs/design.md §5)."""
from __future__ import annotations

import functools

from mmscope import stages
from mmscope.emit.step_shape import StepTelemetry, split_prefill_decode
from mmscope.log import logger


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
    """V1: the persistent batch's first num_reqs rows are the step's requests."""
    batch = runner.input_batch
    n = batch.num_reqs
    return split_prefill_decode(num_scheduled_tokens[:n], batch.num_computed_tokens_cpu[:n],
                                batch.num_prompt_tokens[:n])


def inputs_prepared(hook, wrapped, runner, args, kwargs, num_scheduled_tokens):
    """V1's _prepare_inputs runs once per step on the thread that runs the forward, just before
    it: where step_meta belongs."""
    try:
        telemetry = _telemetry()
        level = telemetry.next_step()
        if level is not None:  # a range or a log line needs the shape: most steps neither
            telemetry.emit(batch_shape(runner, num_scheduled_tokens), level)
    except Exception as e:  # noqa: BLE001
        hook.failed(e)
    return wrapped(*args, **kwargs)


def batch_prepared(hook, wrapped, runner, args, kwargs):
    """V2's prepare_inputs(...) returns the step's InputBatch, once per real step on the thread
    that runs the forward, before it; its rows are the step's requests, prefill by V1's rule
    (computed tokens short of the prompt's)."""
    batch = wrapped(*args, **kwargs)
    try:
        telemetry = _telemetry()
        level = telemetry.next_step()
        if level is not None:
            telemetry.emit(split_prefill_decode(batch.num_scheduled_tokens,
                                                batch.num_computed_tokens_np,
                                                batch.prefill_len_np), level)
    except Exception as e:  # noqa: BLE001
        hook.failed(e)
    return batch
