"""The tracing backends behind `span`/`mark`: NVTX ranges, Chrome trace-event files, torch ranges.

Each backend has span(name) (its own context manager class: the cheapest way to record a range
on it), mark(name), flush() and close().
"""
from __future__ import annotations

import time
from typing import Callable, Protocol

from mmscope.emit.chrome import ChromeTraceWriter


class Backend(Protocol):
    name: str
    live: bool  # False when nothing would be recorded (NVTX with no tool attached)
    span: Callable[[str], object]  # name -> context manager recording one range

    def interval(self, name: str) -> object: ...  # a range ended by .end(), from any thread

    def mark(self, name: str) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class NvtxBackend:
    """Push/pop ranges in NVTX's default domain, where vLLM's own `nvtx.annotate` ranges live."""

    name = "nvtx"

    def __init__(self):
        import nvtx

        # With no tool attached (no nsys, no `mmscope record`) every NVTX call is a no-op: the
        # backend is then left out altogether.
        domain = nvtx.get_domain(None)
        self.live = isinstance(domain, nvtx.Domain)  # else nvtx's documented DummyDomain
        attrs: dict[str, object] = {}
        push, pop = domain.push_range, domain.pop_range

        def attr_of(name: str):
            # Cached event attributes, as nvtx.annotate keeps them: one registered string a name.
            attr = attrs.get(name)
            if attr is None:
                attr = attrs[name] = domain.get_event_attributes(message=name)
            return attr

        class NvtxSpan:
            __slots__ = ("name",)

            def __init__(self, name: str):
                self.name = name

            def __enter__(self):
                push(attr_of(self.name))
                return self

            def __exit__(self, exc_type, exc, tb):
                pop()
                return False

        self.span = NvtxSpan
        self._push, self._pop, self._attr_of = push, pop, attr_of
        self._domain = domain

    def interval(self, name: str) -> "_Ended":
        """An NVTX start/end range: it may overlap others and end on another thread."""
        return _Ended(self._domain.end_range, self._domain.start_range(self._attr_of(name)))

    def mark(self, name: str) -> None:
        # A zero-duration push/pop, as vLLM's own step_meta: nsys shows it as a range.
        self._push(self._attr_of(name))
        self._pop()

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
        now, complete = time.perf_counter_ns, self.writer.complete

        class ChromeSpan:
            __slots__ = ("name", "t0")

            def __init__(self, name: str):
                self.name = name

            def __enter__(self):
                self.t0 = now()
                return self

            def __exit__(self, exc_type, exc, tb):
                complete(self.name, self.t0, now())
                return False

        self.span = ChromeSpan
        self._now, self._complete = now, complete

    def interval(self, name: str) -> "_Ended":
        return _Ended(self._lane_range, (name, self._now()))

    def _lane_range(self, started: tuple[str, int]) -> None:
        self.writer.complete_on_lane(started[0], started[1], self._now())

    def mark(self, name: str) -> None:
        t = self._now()
        self._complete(name, t, t)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.flush()  # not the file: other configurations may share this process's writer


class TorchBackend:
    """`torch.profiler.record_function` ranges, so that the traces of vLLM's own torch profiler
    (--profiler-config) hold the stage tree beside vLLM's scopes."""

    name = "torch"
    live = True

    def __init__(self):
        from torch.profiler import record_function

        self.span = self._record = record_function  # torch's own context manager and decorator

    def mark(self, name: str) -> None:
        with self._record(name):
            pass

    def interval(self, name: str) -> "_Ended":
        """torch's ranges are scopes of one thread: a range of waiting work has none here."""
        return _Ended(lambda _: None, None)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class _Ended:
    """A started range of `Backend.interval`, closed by end()."""

    __slots__ = ("_close", "_token")

    def __init__(self, close, token):
        self._close, self._token = close, token

    def end(self) -> None:
        self._close(self._token)


def make_backend(name: str, trace_dir: str) -> Backend:
    if name == "nvtx":
        return NvtxBackend()
    if name == "chrome":
        return ChromeBackend(trace_dir)
    if name == "torch":
        return TorchBackend()
    raise ValueError(name)
