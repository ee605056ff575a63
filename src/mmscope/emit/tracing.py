"""Emit stage ranges: `span(name)` and `mark(name)` routed to the nvtx, chrome or no backend.

Selected by MMSCOPE_TRACE=off|nvtx|chrome (comma-separated) or VLLM_NVTX_SCOPES_FOR_PROFILING=1.
Hot `with` blocks take their span from `span_factory()`, the cheapest one for the configuration.
"""
from __future__ import annotations

import functools
import logging
import os
from typing import Callable

from mmscope.emit.backends import Backend, make_backend

logger = logging.getLogger(__name__)

BACKEND_NAMES = ("nvtx", "chrome")

# The active backends; an empty tuple means tracing is off, which is the hot path to keep cheap.
_backends: tuple[Backend, ...] = ()
# enabled() as a module attribute, for C code and per-step checks that cannot afford a call.
on = False
# span's enter/exit call these two directly: one call each, whatever the number of backends.
_begin: Callable[[str], object] = lambda name: None
_end: Callable[[str, object], None] = lambda name, token: None
# What span_factory() returns; set with the backends, by _install.
_span_factory: Callable[[str], object] | None = None
# mark() or its cheapest equivalent (the C factory's), for the per-step step_meta from C.
_mark: Callable[[str], None] = lambda name: None


def parse_spec(spec: str | None, vllm_nvtx: bool = False) -> tuple[str, ...]:
    """Backend names from an MMSCOPE_TRACE value; unknown names are an error."""
    names = [s.strip().lower() for s in (spec or "").split(",") if s.strip()]
    names = [n for n in names if n not in ("off", "none", "0")]
    for n in names:
        if n not in BACKEND_NAMES:
            raise ValueError(f"unknown tracing backend {n!r} (choose from off, nvtx, chrome)")
    if vllm_nvtx and "nvtx" not in names:
        names.insert(0, "nvtx")
    return tuple(dict.fromkeys(names))


def configure(spec: str | None = None, trace_dir: str | None = None) -> tuple[str, ...]:
    """(Re)select the backends; with no arguments, read them from the environment."""

    if spec is None:
        spec = os.environ.get("MMSCOPE_TRACE", "")
    vllm_nvtx = os.environ.get("VLLM_NVTX_SCOPES_FOR_PROFILING", "0") not in ("", "0")
    trace_dir = trace_dir or os.environ.get("MMSCOPE_TRACE_DIR", "mmscope-traces")
    try:
        names = parse_spec(spec, vllm_nvtx)
    except ValueError as e:
        logger.warning("mmscope: %s; tracing stays off", e)
        names = ()
    for b in _backends:
        b.close()
    backends = [make_backend(n, trace_dir) for n in names]
    # NVTX with no tool attached records nothing: drop it so spans cost what disabled ones do.
    _install(tuple(b for b in backends if b.live))
    return names


def _install(backends: tuple[Backend, ...]) -> None:
    global _backends, _begin, _end, _span_factory, _mark, on
    if len(backends) == 1:
        _begin, _end = backends[0].begin, backends[0].end
    else:
        def _begin(name):
            return [b.begin(name) for b in backends]

        def _end(name, tokens):
            for b, tok in zip(reversed(backends), reversed(tokens)):
                b.end(name, tok)
    own = getattr(backends[0], "span_factory", None) if len(backends) == 1 else None
    _span_factory = own if own is not None else span
    _mark = getattr(own, "mark", None) or mark
    _backends = backends
    on = bool(backends)


def active() -> tuple[str, ...]:
    """The backends that record something (NVTX counts only with a tool attached)."""
    return tuple(b.name for b in _backends)


def enabled() -> bool:
    """Whether any backend records: cheap enough for a per-step check."""
    return bool(_backends)


def span_factory() -> Callable[[str], object]:
    """The cheapest `name -> context manager` for the current configuration, for `with` blocks
    only (not a decorator): the chrome backend's C span when chrome is the only backend that
    records and the extension is built, else `span`. Ask again after each configure()."""
    return _span_factory


def flush() -> None:
    for b in _backends:
        b.flush()


class span:
    """A named range: `with span("x"):` or `@span("x")`. Costs next to nothing when tracing is off."""

    __slots__ = ("name", "_token")

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        if _backends:
            self._token = _begin(self.name)
        return self

    def __exit__(self, exc_type, exc, tb):
        if _backends:
            try:
                _end(self.name, self._token)
            except AttributeError:
                pass  # opened before configure() switched tracing on: nothing to close
        return False

    def __call__(self, fn: Callable) -> Callable:
        name = self.name

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with _span_factory(name):  # looked up per call: it follows configure()
                return fn(*args, **kwargs)
        return wrapper


def mark(name: str) -> None:
    """A zero-duration range (opened and closed at once), e.g. the per-step `step_meta`."""
    for b in _backends:
        b.mark(name)


configure()
