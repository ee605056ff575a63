"""A Chrome/Perfetto trace-event file per process, appended to in the JSON Array Format.

A thread appends whole events every FLUSH_INTERVAL_S; the closing `]` comes at exit. The format
makes that bracket optional precisely so that a killed process leaves a readable trace.
"""
from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import threading
import time

# Beyond this many unflushed events a process keeps counting but stops storing.
MAX_PENDING = 1_000_000
# vLLM's default shutdown kills EngineCore and its workers without running atexit: the timed
# flush bounds what a stop (or kill -9) loses to this interval.
FLUSH_INTERVAL_S = 0.5
FLUSH_CHUNK = 256  # events formatted per hold of the GIL (about 0.2 ms)
CLOCK = "CLOCK_MONOTONIC"  # time.perf_counter_ns on Linux
# Names are JSON-quoted once and kept; step_meta names change with every batch shape, so in a
# long-running server the kept set is bounded (cleared when full: re-quoting costs 1 us a name).
MAX_QUOTED = 4096
# Thread ids of the lanes that hold ranges of waiting work (complete_on_lane): above Linux's
# largest pid (2**22), below the 24 bits nsys gives a thread id.
LANE_TID_BASE = 8_000_000


class ChromeTraceWriter:
    _writers: dict[tuple[int, str], "ChromeTraceWriter"] = {}
    _lock = threading.Lock()

    def __init__(self, path: str):
        self.path = path
        self.pid = os.getpid()
        self.pending: list[tuple[str, int, int, int]] = []
        self.thread_names: dict[int, str] = {}
        self._new_threads: list[int] = []
        self._dropped = 0
        self.closed = False
        self._quoted: dict[str, str] = {}
        self._flush_lock = threading.Lock()
        self._tls = threading.local()
        self._lanes: list[int] = []  # the last end written on each lane
        self._lane_lock = threading.Lock()
        self.now = time.perf_counter_ns
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        process = {"name": "process_name", "ph": "M", "pid": self.pid, "tid": 0,
                   "args": {"name": multiprocessing.current_process().name}}
        # The clock domain first, so that a reader can align this file with traces on other
        # clocks (torch's wall-clock base) even when the process was killed.
        clock = {"name": "clock", "ph": "M", "pid": self.pid, "tid": 0,
                 "args": {"clock": CLOCK, "producer": "mmscope",
                          "wall_minus_clock_ns": time.time_ns() - time.perf_counter_ns()}}
        os.write(self._fd, ("[\n" + json.dumps(process) + ",\n" + json.dumps(clock)
                            + ",\n").encode())
        atexit.register(self.close)
        self._start_flusher()

    @classmethod
    def for_process(cls, trace_dir: str) -> "ChromeTraceWriter":
        """One writer per process and folder; a forked child gets its own file."""
        key = (os.getpid(), os.path.abspath(trace_dir))
        with cls._lock:
            writer = cls._writers.get(key)
            if writer is None:
                os.makedirs(trace_dir, exist_ok=True)
                path = os.path.join(trace_dir, f"mmscope-{key[0]}.trace.json")
                writer = cls._writers[key] = cls(path)
            return writer

    @property
    def dropped(self) -> int:
        """Events counted but not stored (pending was full)."""
        return self._dropped

    def complete(self, name: str, start_ns: int, end_ns: int) -> None:
        try:
            tid = self._tls.tid  # get_native_id() is a system call: 3x this lookup
        except AttributeError:
            tid = self._register_thread()
        pending = self.pending
        if len(pending) < MAX_PENDING:
            pending.append((name, start_ns, end_ns, tid))
        else:
            self._dropped += 1

    def complete_on_lane(self, name: str, start_ns: int, end_ns: int) -> None:
        """A range of work that waits rather than runs on a thread (a download awaited on the
        event loop, overlapping others), written once it ends on the first lane free since its
        start: ranges of a lane never overlap, so each thread of the file still nests."""
        with self._lane_lock:
            lane = next((i for i, end in enumerate(self._lanes) if end <= start_ns), None)
            if lane is None:
                lane = len(self._lanes)
                self._lanes.append(end_ns)
                tid = LANE_TID_BASE + lane
                self.thread_names[tid] = f"mmscope lane {lane}"
                self._new_threads.append(tid)
            self._lanes[lane] = end_ns
        if len(self.pending) < MAX_PENDING:
            self.pending.append((name, start_ns, end_ns, LANE_TID_BASE + lane))
        else:
            self._dropped += 1

    def _register_thread(self) -> int:
        tid = self._tls.tid = threading.get_native_id()
        if tid not in self.thread_names:
            self.thread_names[tid] = threading.current_thread().name
            self._new_threads.append(tid)
        return tid

    def _start_flusher(self) -> None:
        def loop():
            while not self.closed:
                time.sleep(FLUSH_INTERVAL_S)
                self.flush()
        threading.Thread(target=loop, name="mmscope-chrome-flush", daemon=True).start()

    def flush(self) -> None:
        if os.getpid() != self.pid:
            return  # a forked child must not write into its parent's file
        with self._flush_lock:
            if self.closed:
                return
            for data in self._take():
                os.write(self._fd, data)
                # Formatting holds the GIL; between chunks the engine thread gets it back at
                # once instead of waiting out the interpreter's 5 ms switch interval.
                time.sleep(0)

    def _take(self):
        """The pending events as bytes, FLUSH_CHUNK events at a time."""
        # One list for the writer's life: a copy and a `del` of its first n items are each one
        # operation under the GIL, so spans other threads append meanwhile are kept, not lost.
        pending = self.pending
        n = len(pending)
        events = pending[:n]
        del pending[:n]
        new = self._new_threads
        k = len(new)
        threads = new[:k]
        del new[:k]
        head = "".join(json.dumps({"name": "thread_name", "ph": "M", "pid": self.pid, "tid": tid,
                                   "args": {"name": self.thread_names[tid]}}) + ",\n"
                       for tid in threads)
        if head:
            yield head.encode()
        for i in range(0, len(events), FLUSH_CHUNK):
            yield self._format(events[i:i + FLUSH_CHUNK])

    def _format(self, events: list) -> bytes:
        # Names are JSON-escaped once and kept.
        quoted = self._quoted
        if len(quoted) > MAX_QUOTED:
            quoted.clear()
        for n in {e[0] for e in events}.difference(quoted):
            quoted[n] = json.dumps(n)
        return format_events(events, quoted, self.pid)

    def close(self) -> None:
        """Write what is left and the closing bracket: the file becomes strict JSON."""
        if os.getpid() != self.pid:
            return
        with self._flush_lock:
            if self.closed:
                return
            end = json.dumps({"name": "trace_end", "ph": "M", "pid": self.pid, "tid": 0,
                              "args": {"producer": "mmscope", "clock": CLOCK,
                                       "dropped_events": self.dropped}})
            os.write(self._fd, b"".join(self._take()) + (end + "\n]\n").encode())
            os.close(self._fd)
            self.closed = True


def format_events(events: list, quoted: dict[str, str], pid: int) -> bytes:
    """Complete ("X") events as JSON lines, formatted by hand (json.dumps per event costs 4x as
    much) in one `%` over the whole chunk (a third cheaper than one per event). Chrome wants
    microseconds; integer arithmetic keeps the nanoseconds as three decimals."""
    one = '{"name":%s,"ph":"X","ts":%d.%03d,"dur":%d.%03d,"pid":' + str(pid) + ',"tid":%d},\n'
    args: list = []
    add = args.extend
    for n, t0, t1, tid in events:
        d = t1 - t0
        add((quoted[n], t0 // 1000, t0 % 1000, d // 1000, d % 1000, tid))
    return ((one * len(events)) % tuple(args)).encode()


def read_events(text: str) -> list | dict:
    """Parse a trace file's text, also an unterminated JSON array (a process that was killed)."""
    try:
        return json.loads(text)
    except ValueError:
        stripped = text.rstrip()
        if not stripped.startswith("["):
            raise
        return json.loads(stripped.rstrip(",") + "]")
