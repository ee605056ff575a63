"""A Chrome/Perfetto trace-event file per process, rewritten atomically at each flush.

A reader never sees a half-written file: each flush writes a temporary file and renames it.
"""
from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import threading
import time

# Beyond this many events a process keeps counting but stops storing (memory stays bounded).
MAX_EVENTS = 2_000_000
FLUSH_INTERVAL_S = 5.0


class ChromeTraceWriter:
    _writers: dict[tuple[int, str], "ChromeTraceWriter"] = {}
    _lock = threading.Lock()

    def __init__(self, path: str):
        self.path = path
        self.pid = os.getpid()
        self.events: list[tuple[str, int, int, int]] = []
        self.thread_names: dict[int, str] = {}
        self.dropped = 0
        self._flushed_len = -1
        self._flush_lock = threading.Lock()
        self.now = time.perf_counter_ns
        atexit.register(self.flush)
        self._start_flusher()

    @classmethod
    def for_process(cls, trace_dir: str) -> "ChromeTraceWriter":
        """One writer per process; a forked child gets its own file rather than its parent's."""
        key = (os.getpid(), os.path.abspath(trace_dir))
        with cls._lock:
            writer = cls._writers.get(key)
            if writer is None:
                os.makedirs(trace_dir, exist_ok=True)
                path = os.path.join(trace_dir, f"mmscope-{key[0]}.trace.json")
                writer = cls._writers[key] = cls(path)
            return writer

    def complete(self, name: str, start_ns: int, end_ns: int) -> None:
        tid = threading.get_native_id()
        if tid not in self.thread_names:
            self.thread_names[tid] = threading.current_thread().name
        if len(self.events) < MAX_EVENTS:
            self.events.append((name, start_ns, end_ns, tid))
        else:
            self.dropped += 1

    def _start_flusher(self) -> None:
        def loop():
            while True:
                time.sleep(FLUSH_INTERVAL_S)
                self.flush()
        threading.Thread(target=loop, name="mmscope-chrome-flush", daemon=True).start()

    def flush(self) -> None:
        if os.getpid() != self.pid:
            return  # a forked child must not overwrite its parent's file
        with self._flush_lock:
            n = len(self.events)
            if n == self._flushed_len:
                return
            doc = self._document(self.events[:n])
            tmp = f"{self.path}.{threading.get_native_id()}.tmp"
            with open(tmp, "w") as f:
                json.dump(doc, f, separators=(",", ":"))
            os.replace(tmp, self.path)
            self._flushed_len = n

    def _document(self, events: list[tuple[str, int, int, int]]) -> dict:
        pid = self.pid
        out = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                "args": {"name": multiprocessing.current_process().name}}]
        out += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": n}}
                for tid, n in list(self.thread_names.items())]
        # Chrome wants microseconds; three decimals keep the nanoseconds.
        out += [{"name": name, "ph": "X", "ts": round(t0 / 1000, 3),
                 "dur": round((t1 - t0) / 1000, 3), "pid": pid, "tid": tid}
                for name, t0, t1, tid in events]
        return {"traceEvents": out, "displayTimeUnit": "ns",
                "otherData": {"producer": "mmscope", "clock": "CLOCK_MONOTONIC",
                              "dropped_events": self.dropped}}
