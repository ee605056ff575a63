"""What rides from a worker process to EngineCore on the step's ModelRunnerOutput: the worker's
stage durations and EC transfer counts (docs/design.md §4, Transport).

vLLM pickles the output whole between processes, so an attribute set on it rides along: these two
are the only attributes mmscope sets on vLLM's objects.
"""
from __future__ import annotations

import functools

from mmscope.emit import tracing
from mmscope.emit.stage_timer import WORKER
from mmscope.vllm.ec_connector import TRANSFERS
from mmscope.vllm.patching import failed, retire

SENT_DURATIONS = "_mmscope_stage_durations"
SENT_TRANSFERS = "_mmscope_ec_transfers"


@functools.cache
def _vllm_outputs():
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput
    return ModelRunnerOutput, EMPTY_MODEL_RUNNER_OUTPUT


def carried(hook_name: str, span: str | None = None):
    """A wrapper on a call that returns the step's output (the runners' execute_model and
    sample_tokens, an async output's get_output): the durations and counts so far ride on it.
    An async output (what GPU runners return) is no ModelRunnerOutput yet: its get_output()
    makes one once the step's device work is done, so device-timed stages have completed too.
    Where the scheduler runs in this same process it takes them itself, so nothing is sent.
    vLLM's shared empty output is never written to: the durations wait for the next real one.
    `span`: the range this call is while tracing."""
    def carry(wrapped, args, kwargs):
        output = wrapped(*args, **kwargs)
        if WORKER.collected_in_process:
            if span is None or not tracing.on:  # while the call is a range, it stays one
                retire(hook_name, "the scheduler shares this process and takes the durations "
                                  "itself")
        elif output is not None and (WORKER.pending or TRANSFERS.pending):
            try:
                model_runner_output, empty = _vllm_outputs()
                if isinstance(output, model_runner_output) and output is not empty:
                    setattr(output, SENT_DURATIONS, WORKER.drain())
                    setattr(output, SENT_TRANSFERS, TRANSFERS.drain())
            except Exception as e:  # noqa: BLE001
                failed(hook_name, e)
        return output

    if span is None:
        return lambda wrapped, instance, args, kwargs: carry(wrapped, args, kwargs)
    return tracing.spanned(span, carry)


def received(model_runner_output) -> dict[str, list[int]] | None:
    """EngineCore: the durations a worker process hung on this step's output (its counts join
    this process's TRANSFERS)."""
    sent = getattr(model_runner_output, SENT_TRANSFERS, None)
    if sent:
        TRANSFERS.merge(sent)
    return getattr(model_runner_output, SENT_DURATIONS, None)
