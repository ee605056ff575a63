"""What rides from a worker process to EngineCore: three attributes set on the step's
ModelRunnerOutput, which vLLM pickles whole between processes (docs/design.md §4, Transport).

The worker attaches (worker/outputs.py), EngineCore takes (engine_core/handoff.py).
"""
from __future__ import annotations

import functools

DURATIONS = "_mmscope_stage_durations"  # worker stage -> durations in ns
TRANSFERS = "_mmscope_ec_transfers"  # carry/transfers.py's counts
HOOKS_OFF = "_mmscope_hooks_off"  # hook -> why


@functools.cache
def _vllm_outputs():
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput
    return ModelRunnerOutput, EMPTY_MODEL_RUNNER_OUTPUT


def can_carry(output) -> bool:
    """A real ModelRunnerOutput: never vLLM's shared empty one, nor an async output that is no
    ModelRunnerOutput yet."""
    model_runner_output, empty = _vllm_outputs()
    return isinstance(output, model_runner_output) and output is not empty


def attach(output, durations: dict, transfers: dict, hooks_off: dict) -> None:
    setattr(output, DURATIONS, durations)
    setattr(output, TRANSFERS, transfers)
    setattr(output, HOOKS_OFF, hooks_off)


def take(output) -> tuple[dict | None, dict | None, dict | None]:
    """(durations, transfers, hooks off) a worker process attached, each None where absent."""
    return (getattr(output, DURATIONS, None), getattr(output, TRANSFERS, None),
            getattr(output, HOOKS_OFF, None))
