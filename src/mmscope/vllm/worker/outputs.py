"""Worker wrappers of the calls that return the step's output: the worker's stage durations, EC
transfer counts and hooks turned off ride on it to EngineCore (wire/runner_output.py).
"""
from __future__ import annotations

from mmscope.carry.transfers import TRANSFERS
from mmscope.emit import tracing
from mmscope.emit.stage_timer import WORKER
from mmscope.vllm.patching import TURNED_OFF
from mmscope.vllm.wire import runner_output


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
        if runner_output.can_carry(output):
            runner_output.attach(output, WORKER.drain(), TRANSFERS.drain(), TURNED_OFF.drain())
    except Exception as e:  # noqa: BLE001
        hook.failed(e)
