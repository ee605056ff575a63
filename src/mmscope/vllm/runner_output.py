"""What rides from a worker process to EngineCore on the step's ModelRunnerOutput: the worker's
stage durations, EC transfer counts and hooks turned off (docs/design.md §4, Transport).

vLLM pickles the output whole between processes, so an attribute set on it rides along: these three
are the only attributes mmscope sets on vLLM's objects.
"""
from __future__ import annotations

import functools

from mmscope.emit import tracing
from mmscope.emit.stage_timer import WORKER
from mmscope.vllm.ec_connector import TRANSFERS
from mmscope.vllm.patching import TURNED_OFF

SENT_DURATIONS = "_mmscope_stage_durations"
SENT_TRANSFERS = "_mmscope_ec_transfers"
SENT_HOOKS_OFF = "_mmscope_hooks_off"


@functools.cache
def _vllm_outputs():
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput
    return ModelRunnerOutput, EMPTY_MODEL_RUNNER_OUTPUT


def carried(hook, wrapped, instance, args, kwargs):
    """A call that returns the step's output (the runners' execute_model and sample_tokens, an
    async output's get_output): what the worker has so far rides on it. An async output (what
    GPU runners return) is no ModelRunnerOutput yet: its get_output() makes one once the step's
    device work is done, so device-timed stages have completed too. Where the scheduler runs in
    this same process it takes them itself, so nothing is sent and the hook retires. vLLM's
    shared empty output is never written to: the figures wait for the next real one."""
    output = wrapped(*args, **kwargs)
    if WORKER.collected_in_process:
        hook.retire("the scheduler shares this process and takes the durations itself")
    elif output is not None:
        _ride(hook, output)
    return output


def carried_as(span: str):
    """carried(), and the call is range `span` while tracing (in-process it stays only that)."""
    def carry(hook, wrapped, instance, args, kwargs):
        if WORKER.collected_in_process and tracing.on:
            return wrapped(*args, **kwargs)
        return carried(hook, wrapped, instance, args, kwargs)
    return tracing.spanned(span, carry)


def _ride(hook, output) -> None:
    if not (WORKER.pending or TRANSFERS.pending or TURNED_OFF.unsent):
        return
    try:
        model_runner_output, empty = _vllm_outputs()
        if isinstance(output, model_runner_output) and output is not empty:
            setattr(output, SENT_DURATIONS, WORKER.drain())
            setattr(output, SENT_TRANSFERS, TRANSFERS.drain())
            setattr(output, SENT_HOOKS_OFF, TURNED_OFF.drain())
    except Exception as e:  # noqa: BLE001
        hook.failed(e)


def received(model_runner_output) -> dict[str, list[int]] | None:
    """EngineCore: the durations a worker process hung on this step's output (its counts join
    this process's TRANSFERS, its hooks turned off this process's TURNED_OFF)."""
    sent = getattr(model_runner_output, SENT_TRANSFERS, None)
    if sent:
        TRANSFERS.merge(sent)
    off = getattr(model_runner_output, SENT_HOOKS_OFF, None)
    if off:
        TURNED_OFF.merge(off)
    return getattr(model_runner_output, SENT_DURATIONS, None)
