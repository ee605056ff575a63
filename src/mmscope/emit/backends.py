"""The tracing backends behind `span`/`mark`: NVTX ranges, Chrome trace-event files, torch ranges.

Each backend has begin(name) -> token, end(name, token), mark(name), flush() and close().
"""
from __future__ import annotations

from typing import Protocol

from mmscope.emit.chrome import ChromeTraceWriter


class Backend(Protocol):
    name: str
    live: bool  # False when nothing would be recorded (NVTX with no tool attached)

    def begin(self, name: str) -> object: ...
    def end(self, name: str, token: object) -> None: ...
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
        self._domain = nvtx.get_domain(None)
        self.live = isinstance(self._domain, nvtx.Domain)  # else nvtx's documented DummyDomain
        self._attrs: dict[str, object] = {}

    def begin(self, name: str) -> None:
        # Cached event attributes, as nvtx.annotate keeps them: one registered string per name.
        attr = self._attrs.get(name)
        if attr is None:
            attr = self._attrs[name] = self._domain.get_event_attributes(message=name)
        self._domain.push_range(attr)

    def end(self, name: str, token: object) -> None:
        self._domain.pop_range()

    def mark(self, name: str) -> None:
        # A zero-duration push/pop, as the seed's step_meta: nsys shows it as a range.
        self.begin(name)
        self._domain.pop_range()

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


class TorchBackend:
    """`torch.profiler.record_function` ranges, so that the traces of vLLM's own torch profiler
    (--profiler-config) hold the stage tree beside vLLM's scopes."""

    name = "torch"
    live = True

    def __init__(self):
        from torch.profiler import record_function

        self._record = record_function

    def begin(self, name: str) -> object:
        rf = self._record(name)
        rf.__enter__()
        return rf

    def end(self, name: str, token) -> None:
        token.__exit__(None, None, None)

    def mark(self, name: str) -> None:
        with self._record(name):
            pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def make_backend(name: str, trace_dir: str) -> Backend:
    if name == "nvtx":
        return NvtxBackend()
    if name == "chrome":
        return ChromeBackend(trace_dir)
    if name == "torch":
        return TorchBackend()
    raise ValueError(name)
