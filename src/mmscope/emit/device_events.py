"""The device clock of a torch accelerator: its timing events, its "is the current stream
capturing a graph?" query, and event reads that cannot break another thread's CUDA-graph capture.

CUDA's default capture mode (global, torch.cuda.graph's default) forbids an event query from any
thread while a capture runs, and such a query breaks that capture. A thread whose own capture
mode is thread-local answers only for its own captures (cuThreadExchangeStreamCaptureMode): the
reads are made in that mode, which is restored after them. ROCm has the same call under another
name; it is not used here, so a read there can still break a capture in another thread.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools

from mmscope.emit.stage_timer import DeviceEventClock

THREAD_LOCAL = 1  # CU_STREAM_CAPTURE_MODE_THREAD_LOCAL


def clock(device) -> DeviceEventClock:
    """The clock of a torch device's stages (`device.type` is not "cpu"). Nothing here touches
    the device until a stage is timed."""
    import torch

    backend = getattr(torch, device.type, None)
    capturing = getattr(backend, "is_current_stream_capturing", None) or _never
    cuda = device.type == "cuda" and torch.version.cuda is not None
    reading = thread_local_capture if cuda else contextlib.nullcontext
    return DeviceEventClock(lambda: torch.Event(device=device, enable_timing=True), capturing,
                            reading)


def _never() -> bool:
    """A device kind whose torch backend captures no graphs."""
    return False


@contextlib.contextmanager
def thread_local_capture():
    """This thread's capture mode, thread-local for the block: the queries in it are refused
    only by this thread's own capture (which the clock never reads in), not by another's."""
    exchange = _exchange_capture_mode()
    mode = ctypes.c_int(THREAD_LOCAL)
    _check(exchange(ctypes.byref(mode)))  # mode now holds this thread's previous mode
    try:
        yield
    finally:
        _check(exchange(ctypes.byref(mode)))


@functools.cache
def _exchange_capture_mode():
    """The CUDA driver's call, from the driver library torch loaded (one per process)."""
    exchange = ctypes.CDLL("libcuda.so.1").cuThreadExchangeStreamCaptureMode
    exchange.argtypes, exchange.restype = [ctypes.POINTER(ctypes.c_int)], ctypes.c_int
    return exchange


def _check(result: int) -> None:
    if result != 0:
        raise RuntimeError(f"setting this thread's stream-capture mode failed (error {result})")
