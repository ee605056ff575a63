"""The step's own ranges, the parents of the worker's stages (`gpu_model_runner: preprocess`,
`forward`, `sample`, ...), through mmscope's backends; applied only while mmscope traces.

V1 opens them itself; V2 opens none, so they are opened at the calls that bound its phases
(docs/design.md §3a has the mapping).
"""
from __future__ import annotations

from mmscope import stages
from mmscope.emit import tracing


def vllm_scope(hook, wrapped, instance, args, kwargs, name):
    """V1 opens its step ranges through record_function_or_nullcontext(name); while mmscope
    traces, they go through its span, so that every backend holds the worker's whole tree (nvtx
    and torch as vLLM's own switches would)."""
    return tracing.span(name) if tracing.on else wrapped(*args, **kwargs)


# V2: the range open in the current step, preprocess from execute_model's start until the
# forward's start, then forward until execute_model returns. One step at a time per worker.
_open = None


def _switch(name: str | None) -> None:
    global _open
    if _open is not None:
        _open.__exit__(None, None, None)
    _open = tracing.span(name) if name is not None else None
    if _open is not None:
        _open.__enter__()


def step_executed(hook, wrapped, runner, args, kwargs, dummy_run):
    """V2's execute_model: a real step builds its inputs and embeddings (EC load, encoder, EC
    save, gather, embed), then runs the forward. Dummy runs (warm-up, profiling, graph capture)
    are no steps, as under V1."""
    if not tracing.on or dummy_run:
        return wrapped(*args, **kwargs)
    _switch(stages.PREPROCESS)
    try:
        return wrapped(*args, **kwargs)
    finally:
        _switch(None)


def forward_started(hook, wrapped, step_timing, args, kwargs):
    """V2 calls step_timing.forward_start() right before the model's forward, in every mode
    (eager, piecewise or full CUDA graph)."""
    if _open is not None:
        _switch(stages.FORWARD)
    return wrapped(*args, **kwargs)


def _call(hook, wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)


sampled = tracing.spanned(stages.SAMPLE, _call)  # V2's sample(): logits and the sampler
bookkept = tracing.spanned(stages.BOOKKEEP, _call)  # V2's postprocess_sampled()
