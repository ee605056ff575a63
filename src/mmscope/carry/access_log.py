"""The encoder-cache access log: one compact line per committed encoder input, per freed request,
and the capacity, appended by every engine process to one file (MMSCOPE_ACCESS_LOG=FILE); its one
reader is mmscope.cache_size.trace.

Lines are tab-separated; each flush is one O_APPEND write, so several processes share a file:
  C <t_ns> <engine> <capacity_embeds> <bytes_per_embed>   (0: not known; older logs omit it)
  A <t_ns> <engine> <request> <item> <modality> <hash> <embeds> <HIT|MISS|DEFERRED> <source|->
  F <t_ns> <engine> <request>                      (the request released its encoder entries)
"""
from __future__ import annotations

import atexit
import os
import threading
import time

from mmscope.carry.ledger import Item
from mmscope.vocabulary import Outcome

ENV = "MMSCOPE_ACCESS_LOG"
# Lines wait at most this long in memory: vLLM's default shutdown kills EngineCore without running
# atexit, so a timed flush is what bounds the loss at a stop (and at kill -9) to this interval.
FLUSH_INTERVAL_S = 0.5
HEADER = "# mmscope encoder-cache access log v1\n"


class AccessLogWriter:
    """Appends lines to a buffer (no system call per item); a daemon thread writes the buffer
    every FLUSH_INTERVAL_S, in one O_APPEND write under the lock, so lines stay whole and in order.
    A forked child never writes what it inherited (those lines are its parent's): it gets a
    writer of its own."""

    def __init__(self, path: str, engine: str):
        self.path, self.engine = path, engine
        self.pid = os.getpid()
        self._buf: list[str] = []
        self._lock = threading.Lock()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if os.fstat(self._fd).st_size == 0:
            os.write(self._fd, HEADER.encode())
        threading.Thread(target=self._flush_loop, name="mmscope-access-log", daemon=True).start()
        atexit.register(self.flush)

    def _flush_loop(self) -> None:
        while True:
            time.sleep(FLUSH_INTERVAL_S)
            self.flush()

    def capacity(self, embeds: int, bytes_per_embed: int = 0) -> None:
        self._buf.append(f"C\t{time.time_ns()}\t{self.engine}\t{embeds}\t{bytes_per_embed}\n")

    def item(self, outcome: Outcome, item: Item, source: str | None) -> None:
        if outcome == Outcome.PREFIX_COVERED:
            return  # never reaches the encoder cache: not an access
        self._buf.append(f"A\t{time.time_ns()}\t{self.engine}\t{item.request_id}\t{item.index}\t"
                         f"{item.modality}\t{item.key}\t{item.embeds}\t{outcome}\t{source or '-'}\n")

    def freed(self, request_id: str) -> None:
        self._buf.append(f"F\t{time.time_ns()}\t{self.engine}\t{request_id}\n")

    def flush(self) -> None:
        if os.getpid() != self.pid:
            return  # a forked child: the inherited lines are the parent's
        with self._lock:
            # One list for the writer's life: a copy and a `del` of its first n lines are each one
            # step under the GIL, so lines other threads append meanwhile stay for the next flush.
            buf = self._buf
            n = len(buf)
            if n:
                data = "".join(buf[:n]).encode()
                del buf[:n]
                os.write(self._fd, data)


_writer: AccessLogWriter | None = None


def writer() -> AccessLogWriter | None:
    """This process's writer when MMSCOPE_ACCESS_LOG is set (one per process, after fork too)."""
    global _writer
    path = os.environ.get(ENV)
    if not path:
        return None
    if _writer is None or _writer.pid != os.getpid():
        _writer = AccessLogWriter(path, str(os.getpid()))
    return _writer
