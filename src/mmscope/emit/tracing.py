"""Emit stage ranges: `span(name)` and `mark(name)` routed to the nvtx, chrome, torch or no backend.

Selected by MMSCOPE_TRACE=off|nvtx|chrome|torch (comma-separated); vLLM's own switches turn theirs
on too: VLLM_NVTX_SCOPES_FOR_PROFILING=1 -> nvtx, VLLM_CUSTOM_SCOPES_FOR_PROFILING=1 -> torch.
"""
from __future__ import annotations

import os
from typing import Callable

from mmscope.emit.backends import Backend, make_backend
from mmscope.flags import flag
from mmscope.log import logger

BACKEND_NAMES = ("nvtx", "chrome", "torch")

# The backends that record; an empty tuple means tracing is off, the hot path to keep cheap.
_backends: tuple[Backend, ...] = ()
# Whether any backend records, as a module attribute: cheaper than a call in per-step checks.
on = False


class _NoSpan:
    """Tracing off: the span records nothing."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        return False


class _Spans:
    """Several backends at once: each backend's own span, closed in reverse order."""

    __slots__ = ("name", "_open")

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self._open = [b.span(self.name) for b in _backends]
        for s in self._open:
            s.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb):
        for s in reversed(self._open):
            s.__exit__(exc_type, exc, tb)
        return False


# A named range, `with tracing.span("x"):`: the span class of the one
# backend that records (the cheapest), of several, or one that records nothing. Rebound by
# configure(): look it up as `tracing.span` at each use, never import the name.
span: Callable[[str], object] = _NoSpan


def spanned(name: str, call):
    """`call`, run inside span `name` while tracing is on and straight otherwise (no span object
    at all on that road): a hook's wrapper that is also a range."""
    def wrapper(*args):
        if on:
            with span(name):
                return call(*args)
        return call(*args)
    return wrapper


class _Intervals:
    """Ranges of waiting work (`interval`), one per backend that records, ended together."""

    __slots__ = ("_open",)

    def __init__(self, name: str):
        self._open = [b.interval(name) for b in _backends]

    def end(self) -> None:
        for started in self._open:
            started.end()


def interval(name: str) -> _Intervals:
    """A range of work that waits rather than runs on one thread (a download awaited on the
    event loop while others overlap it), ended by `.end()` from any thread: an NVTX start/end
    range, a Chrome range on a lane of its own; a push/pop span would not nest. Call it only
    while tracing is `on`."""
    return _Intervals(name)


def mark(name: str) -> None:
    """A zero-duration range (opened and closed at once), e.g. the per-step `step_meta`."""
    for b in _backends:
        b.mark(name)


def parse_spec(spec: str | None, vllm_nvtx: bool = False, vllm_torch: bool = False) -> tuple[str, ...]:
    """Backend names from an MMSCOPE_TRACE value; unknown names are an error."""
    names = [s.strip().lower() for s in (spec or "").split(",") if s.strip()]
    names = [n for n in names if n not in ("off", "none", "0")]
    for n in names:
        if n not in BACKEND_NAMES:
            raise ValueError(f"unknown tracing backend {n!r} (choose from off, "
                             f"{', '.join(BACKEND_NAMES)})")
    if vllm_nvtx and "nvtx" not in names:
        names.insert(0, "nvtx")
    if vllm_torch and "torch" not in names:
        names.append("torch")
    return tuple(dict.fromkeys(names))


def configure(spec: str | None = None, trace_dir: str | None = None) -> tuple[str, ...]:
    """(Re)select the backends; with no arguments, read them from the environment."""
    if spec is None:
        spec = os.environ.get("MMSCOPE_TRACE", "")
    trace_dir = trace_dir or os.environ.get("MMSCOPE_TRACE_DIR", "mmscope-traces")
    try:
        names = parse_spec(spec, flag("VLLM_NVTX_SCOPES_FOR_PROFILING"),
                           flag("VLLM_CUSTOM_SCOPES_FOR_PROFILING"))
    except ValueError as e:
        logger.warning("mmscope: %s; tracing stays off", e)
        names = ()
    global _backends, on, span
    for b in _backends:
        b.close()
    # NVTX with no tool attached records nothing: dropped, so spans cost what disabled ones do.
    _backends = tuple(b for b in (make_backend(n, trace_dir) for n in names) if b.live)
    on = bool(_backends)
    span = _backends[0].span if len(_backends) == 1 else _Spans if _backends else _NoSpan
    return names


def active() -> tuple[str, ...]:
    """The backends that record something (NVTX counts only with a tool attached)."""
    return tuple(b.name for b in _backends)


def flush() -> None:
    for b in _backends:
        b.flush()


configure()
