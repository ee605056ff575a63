"""The tracing backends behind `span`/`mark`: NVTX ranges and Chrome trace-event files.

Each backend has begin(name) -> token, end(name, token), mark(name), flush() and close(), and
span_factory: its own cheaper span where it has one (the chrome backend's C span), else None.
"""
from __future__ import annotations

from typing import Callable, Protocol

from mmscope.emit.chrome import ChromeTraceWriter


class Backend(Protocol):
    name: str
    live: bool  # False when nothing would be recorded (NVTX with no tool attached)
    # name -> context manager recording on this backend alone, cheaper than tracing.span; or None
    span_factory: Callable[[str], object] | None

    def begin(self, name: str) -> object: ...
    def end(self, name: str, token: object) -> None: ...
    def mark(self, name: str) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class NvtxBackend:
    """Push/pop ranges in NVTX's default domain, where vLLM's own `nvtx.annotate` ranges live."""

    name = "nvtx"
    span_factory = None

    def __init__(self):
        import nvtx
        from nvtx._lib import pop_range, push_range

        # With no tool attached (no nsys, no `mmscope record`) NVTX hands out a dummy domain and
        # every call is a no-op; we skip the calls altogether then.
        self._domain = nvtx.get_domain(None)
        self.live = self._domain is not nvtx._lib.dummy_domain
        self._handle = getattr(self._domain, "handle", None)
        self._attrs: dict[str, object] = {}
        self._push = push_range
        self._pop = pop_range

    def _new_attr(self, name: str):
        # Cached event attributes, as nvtx.annotate keeps them: one registered string per name.
        attr = self._attrs[name] = self._domain.get_event_attributes(message=name)
        return attr

    def begin(self, name: str) -> None:
        self._push(self._attrs.get(name) or self._new_attr(name), self._handle)

    def end(self, name: str, token: object) -> None:
        self._pop(self._handle)

    def mark(self, name: str) -> None:
        # A zero-duration push/pop, as the seed's step_meta: nsys shows it as a range.
        self.begin(name)
        self._pop(self._handle)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class ChromeBackend:
    """Complete ("X") events in a Chrome/Perfetto trace file, one file per process."""

    name = "chrome"
    live = True

    def __init__(self, trace_dir: str):
        self.writer = ChromeTraceWriter.for_process(trace_dir)
        self._now, self._complete = self.writer.now, self.writer.complete
        self.span_factory = self.writer.c_span_factory()

    def begin(self, name: str) -> int:
        return self._now()  # the token is the start time

    def end(self, name: str, token: int) -> None:
        self._complete(name, token, self._now())

    def mark(self, name: str) -> None:
        t = self._now()
        self._complete(name, t, t)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.flush()  # not the file: other configurations may share this process's writer


def make_backend(name: str, trace_dir: str) -> Backend:
    if name == "nvtx":
        return NvtxBackend()
    if name == "chrome":
        return ChromeBackend(trace_dir)
    raise ValueError(name)
