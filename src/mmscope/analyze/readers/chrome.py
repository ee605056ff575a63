"""Load a Chrome trace-event file (mmscope's `chrome` backend, torch profiler) into a RangeTable.

X and B/E events become ranges, instants marks (gzip, bare lists too); a torch profiler trace's
ranges are its annotations, its GPU ops and their launching calls its device side; each file's
clock is known (torch: its UTC base time; mmscope: CLOCK_MONOTONIC), a folder read on one clock.
"""
from __future__ import annotations

import gzip
import os
from dataclasses import dataclass

import numpy as np

from mmscope.analyze.ranges import table as tbl
from mmscope.analyze.ranges import device
from mmscope.analyze.readers import malformed
from mmscope.errors import UserError
from mmscope.emit.chrome import read_events

GZIP_MAGIC = b"\x1f\x8b"
# A torch profiler (Kineto) trace says what each event is by its category: the ranges a program
# named (record_function) are the stages; GPU ops, the runtime calls that launched them (joined
# by "correlation") and each range's device span are its device side; the rest (operators,
# Python functions, syncs, ...) is the profiler's own record, not read.
KINETO_KEYS = ("schemaVersion", "deviceProperties", "baseTimeNanoseconds")
# Kineto's categories (older versions capitalised them): a file with one is Kineto's.
KINETO_CATEGORIES = frozenset(("user_annotation", "gpu_user_annotation", "cpu_op", "operator",
                               "python_function", "kernel", "gpu_memcpy", "gpu_memset", "memcpy",
                               "memset", "cuda_runtime", "cuda_driver", "runtime"))
STAGE_CATEGORY = "user_annotation"
DEVICE_SPAN = "gpu_user_annotation"
GPU_OPS = frozenset(("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"))
LAUNCHES = frozenset(("cuda_runtime", "cuda_driver", "runtime"))
_ID_LIMIT = 1 << 24  # pid and tid each get 24 bits of the nsys-style thread key
_INSTANTS = ("i", "I", "R")
US_IN_NS = 1000


def looks_like_json(head: bytes) -> bool:
    return head.startswith(GZIP_MAGIC) or head.lstrip()[:1] in (b"{", b"[")


# A torch profiler trace counts from its `baseTimeNanoseconds` on the UTC clock; mmscope's own
# traces are CLOCK_MONOTONIC, their `clock` metadata event giving the wall clock's offset.
@dataclass(frozen=True)
class Clock:
    """A trace's clock: `domain` names it; `wall_offset_ns` turns its times into UTC epoch ns
    (None where the file does not say)."""

    domain: str
    wall_offset_ns: int | None = None


TORCH, MONOTONIC, UNKNOWN = "torch profiler (UTC base)", "CLOCK_MONOTONIC", "unknown"


def clock_of(doc, events: list) -> Clock:
    if isinstance(doc, dict) and isinstance(doc.get("baseTimeNanoseconds"), int):
        return Clock(TORCH, doc["baseTimeNanoseconds"])
    for ev in events:
        if ev.get("ph") != "M" or ev.get("name") not in ("clock", "trace_end"):
            continue
        args = _args(ev)
        if args.get("clock") == MONOTONIC:
            offset = args.get("wall_minus_clock_ns")
            return Clock(MONOTONIC, offset if isinstance(offset, int) else None)
    return Clock(UNKNOWN)


def load(path: str) -> tbl.RangeTable:
    return load_all([path], path)


def load_all(paths: list[str], label: str) -> tbl.RangeTable:
    """Several trace files as one table (the chrome backend writes one file per process).

    The rule for several files: on one clock, times are taken as they are; torch profiler
    traces alone are each moved onto the UTC clock by their base time (exact, as each file
    states it); files on different clocks, or torch traces beside mmscope's (two recordings of
    the same steps), are refused: their alignment would be approximate and their steps counted
    twice."""
    parsed, kineto = [], []
    for p in paths:
        doc = _parse(p)
        events = _events(p, doc)
        parsed.append((p, events, clock_of(doc, events)))
        kineto.append(_is_kineto(doc, events))
    shifts, clock = _alignment(parsed, label)
    builder = _Builder()
    try:
        for (_, events, _), shift, is_kineto in zip(parsed, shifts, kineto):
            builder.begin(shift, is_kineto)
            for ev in events:
                builder.add(ev)
            builder.end()
        return builder.table(clock)
    except (TypeError, ValueError, OverflowError) as e:
        raise UserError(f"{label}: malformed trace event ({_first_line(e)})") from None


def _is_kineto(doc, events: list) -> bool:
    if isinstance(doc, dict) and any(k in doc for k in KINETO_KEYS):
        return True
    return any(str(ev.get("cat", "")).lower() in KINETO_CATEGORIES for ev in events)


def _alignment(parsed: list, label: str) -> tuple[list[int], str]:
    """The shift (ns) of each file's times, and the clock the table is on."""
    clocks = [c for _, _, c in parsed]
    domains = {c.domain for c in clocks}
    if len(parsed) == 1:
        return [0], clocks[0].domain
    if domains == {TORCH}:
        return [c.wall_offset_ns for c in clocks], "UTC epoch (torch profiler base times)"
    if len(domains) == 1:
        return [0] * len(parsed), clocks[0].domain
    first = {}
    for p, _, c in parsed:
        first.setdefault(c.domain, os.path.basename(p))
    named = ", ".join(f"{name} on {domain}" for domain, name in sorted(first.items()))
    raise UserError(f"{label}: traces on different clocks ({named}); a torch profiler trace "
                    "and mmscope's traces are two recordings of the same steps: analyze each "
                    "on its own")


def _parse(path: str):
    try:
        with open(path, "rb") as f:
            data = f.read()
        if data.startswith(GZIP_MAGIC):
            data = gzip.decompress(data)
        # mmscope's own files may lack the closing bracket (a killed process), as the format allows.
        return read_events(data.decode("utf-8"))
    except (OSError, EOFError, ValueError) as e:  # JSON, UTF-8 and gzip errors are ValueErrors
        raise UserError(f"{path}: not a readable Chrome trace JSON ({_first_line(e)})") from None


def _first_line(e: Exception) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0]


def _events(path: str, doc) -> list:
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list) or not all(isinstance(e, dict) and "ph" in e for e in events):
        raise UserError(f"{path}: JSON but not a Chrome trace (expected a list of events or an "
                        "object with \"traceEvents\")")
    return events


def _ns(value) -> int:
    """Chrome times are microseconds (floats); ranges are kept in integer nanoseconds."""
    return round(float(value) * 1000)



class _Builder:
    """Collects the columns; B/E pairs close on a per-thread stack, as the format specifies."""

    def __init__(self):
        self.names: dict[str, int] = {}
        self.cols: dict[str, list] = {k: [] for k in ("name", "start", "end", "kind", "thread")}
        self.ids: dict[tuple[str, object], int] = {}
        self.thread_names: dict[int, str] = {}
        self.process_names: dict[int, str] = {}
        self.open: dict[int, list[int]] = {}
        self.gpu = _GpuWork()
        self.shift = 0  # added to this file's times (ns): its place on the profile's clock
        self.kineto = False  # a torch profiler trace: stages, device side and the rest told apart
        self.any_kineto = False
        self.slack_ns = 0
        self.skipped = malformed.Skipped()
        self.dropped: set[int] = set()  # rows of a B whose E came before it

    def begin(self, shift: int, kineto: bool) -> None:
        self.shift, self.kineto = shift, kineto
        self.any_kineto |= kineto
        self.whole_us, self.latest_us = True, 0.0
        self.gpu.begin()

    def end(self) -> None:
        """The file's device side joined; its time resolution taken in."""
        self.gpu.end()
        if self.kineto:
            self.slack_ns = max(self.slack_ns, _slack_ns(self.whole_us, self.latest_us))

    def table(self, clock: str) -> tbl.RangeTable:
        c = self.cols
        if self.dropped:
            keep = [r for r in range(len(c["start"])) if r not in self.dropped]
            c = {k: [v[r] for r in keep] for k, v in c.items()}
            self.gpu.renumber(keep)
        table = tbl.build(raw_names=list(self.names), name_id=c["name"], start=c["start"],
                          end=c["end"], kind=c["kind"], thread=c["thread"],
                          thread_names=self.thread_names, process_names=self.process_names,
                          source="chrome-json", clock=clock, slack_ns=self.slack_ns)
        table.device, table.no_device = self.gpu.work(self.any_kineto, table)
        table.malformed = self.skipped
        return table

    def add(self, ev: dict) -> None:
        ph = ev.get("ph")
        if ph == "M":
            self.metadata(ev)
            return
        if "ts" not in ev:
            return
        if self.kineto and not self.kineto_stage(ev, ph):
            return
        if ph not in ("X", "B", "E") + _INSTANTS:
            return
        self.skipped.events += 1
        why = self.malformed(ev, ph)
        if why:
            self.skipped.add(f"{_said(ev)}: {why}")
        elif ph == "X":
            start = _ns(ev["ts"]) + self.shift
            self.row(ev, start, start + _ns(ev["dur"]), tbl.PUSH_POP)
        elif ph == "B":
            self.open.setdefault(self.thread(ev), []).append(
                self.row(ev, _ns(ev["ts"]) + self.shift, None, tbl.PUSH_POP))
        elif ph == "E":
            self.close(ev)
        else:
            t = _ns(ev["ts"]) + self.shift
            self.row(ev, t, t, tbl.MARK)

    def malformed(self, ev: dict, ph) -> str | None:
        """Why an event cannot be a range or mark (None: it can)."""
        if not _number(ev["ts"]):
            return f"a time that is no number ({ev['ts']!r})"
        if ph != "E" and not isinstance(ev.get("name"), str):
            return f"a name that is not text ({ev.get('name')!r})"
        if ph == "X":
            if "dur" not in ev:
                return "a complete event without a duration"
            if not _number(ev["dur"]) or ev["dur"] < 0:
                return f"a negative or unreadable duration ({ev['dur']!r})"
        if ph == "E" and not self.open.get(self.thread(ev)):
            return "an end without its begin"
        return None

    def close(self, ev: dict) -> None:
        """An E ends the last open B of its thread, unless it comes before it: then both go."""
        stack = self.open[self.thread(ev)]
        row = stack.pop()
        end = _ns(ev["ts"]) + self.shift
        if end < self.cols["start"][row]:
            self.dropped.add(row)
            self.skipped.add(f"{_said(ev, list(self.names)[self.cols['name'][row]])}: ends at "
                             f"{ev['ts']} µs, before its begin")
            return
        self.cols["end"][row] = end

    def kineto_stage(self, ev: dict, ph) -> bool:
        """Whether a Kineto event is a stage; the device side is taken on the way."""
        cat = str(ev.get("cat", "")).lower()
        if cat == STAGE_CATEGORY:
            self.resolution(ev)
            return True
        if ph != "X":
            return False
        args = _args(ev)
        if cat in GPU_OPS:
            self.gpu.op(ev, args, self.span(ev))
        elif cat in LAUNCHES:
            self.gpu.call(args.get("correlation"), self.thread(ev), self.span(ev))
        elif cat == DEVICE_SPAN:
            self.gpu.span(args.get("External id"), self.span(ev))
        return False

    def span(self, ev: dict) -> tuple[int, int]:
        start = _ns(ev["ts"]) + self.shift
        return start, start + _ns(ev.get("dur", 0))

    def resolution(self, ev: dict) -> None:
        ts = ev["ts"]
        self.whole_us = self.whole_us and isinstance(ts, int) and isinstance(ev.get("dur", 0), int)
        self.latest_us = max(self.latest_us, abs(float(ts)))

    def row(self, ev: dict, start: int, end: int | None, kind: int) -> int:
        c = self.cols
        name = ev["name"]
        c["name"].append(self.names.setdefault(name, len(self.names)))
        c["start"].append(start)
        # No E (yet): build() reads an end before the start as "unclosed".
        c["end"].append(start - 1 if end is None else max(end, start))
        c["kind"].append(kind)
        c["thread"].append(self.thread(ev))
        if self.kineto:
            self.gpu.annotation(_args(ev).get("External id"), len(c["start"]) - 1)
        return len(c["start"]) - 1

    def thread(self, ev: dict) -> int:
        return (self.key("pid", ev.get("pid", 0)) << 24) | self.key("tid", ev.get("tid", 0))

    def key(self, which: str, value) -> int:
        """An id as nsys would have it; names or huge ids get stable small stand-ins."""
        if isinstance(value, int) and 0 <= value < _ID_LIMIT:
            return value
        found = self.ids.get((which, value))
        if found is None:
            found = self.ids[(which, value)] = _ID_LIMIT - 1 - len(self.ids)
        return found

    def metadata(self, ev: dict) -> None:
        name = _args(ev).get("name")
        if not isinstance(name, str):
            return
        if ev.get("name") == "thread_name":
            self.thread_names[self.thread(ev)] = name
        elif ev.get("name") == "process_name":
            self.process_names[self.key("pid", ev.get("pid", 0))] = name


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _said(ev: dict, name=None) -> str:
    """An event as a person finds it in the file: phase, name, time, pid and tid."""
    name = ev.get("name") if name is None else name
    return (f"{ev.get('ph')} event {name!r} at {ev.get('ts')!r} µs, pid {ev.get('pid')!r} "
            f"tid {ev.get('tid')!r}")


def _args(ev: dict) -> dict:
    args = ev.get("args")
    return args if isinstance(args, dict) else {}


def _slack_ns(whole_us: bool, latest_us: float) -> int:
    """How far a Kineto trace's child range may end after its parent: twice its resolution (a
    start and a duration each rounded): whole microseconds, or the spacing of float64 at its
    latest time (0.25 µs at today's epoch times)."""
    import math

    resolution_us = 1.0 if whole_us else math.ulp(latest_us)
    return math.ceil(2 * resolution_us * US_IN_NS)


class _GpuWork:
    """A Kineto trace's GPU ops, launching calls and device spans, joined file by file (its
    correlation and External ids count per file)."""

    def __init__(self):
        self.cols: dict[str, list] = {k: [] for k in ("thread", "call_start", "start", "end",
                                                      "name", "stream")}
        self.names: dict[str, int] = {}
        self.streams: dict[str, int] = {}
        self.span_rows: dict[str, list] = {"rows": [], "first": [], "last": []}
        self.seen_gpu = False

    def begin(self) -> None:
        self.ops: dict = {}
        self.calls: dict = {}
        self.spans: dict = {}
        self.rows: dict = {}

    def op(self, ev: dict, args: dict, span: tuple[int, int]) -> None:
        self.seen_gpu = True
        device = args.get("device", ev.get("pid", 0))
        stream = f"GPU {device} stream {args.get('stream', ev.get('tid', 0))}"
        entry = (span, self.names.setdefault(str(ev.get("name", "")), len(self.names)),
                 self.streams.setdefault(stream, len(self.streams)))
        self.ops.setdefault(args.get("correlation"), []).append(entry)

    def call(self, correlation, thread: int, span: tuple[int, int]) -> None:
        if correlation is not None:
            self.calls[correlation] = (thread, span)

    def span(self, external_id, span: tuple[int, int]) -> None:
        first, last = self.spans.get(external_id, span)
        self.spans[external_id] = (min(first, span[0]), max(last, span[1]))

    def renumber(self, keep: list[int]) -> None:
        """The table keeps these rows only: the spans follow their rows (a dropped row's go)."""
        new = {old: i for i, old in enumerate(keep)}
        rows = self.span_rows
        kept = [j for j, r in enumerate(rows["rows"]) if r in new]
        self.span_rows = {"rows": [new[rows["rows"][j]] for j in kept],
                          "first": [rows["first"][j] for j in kept],
                          "last": [rows["last"][j] for j in kept]}

    def annotation(self, external_id, row: int) -> None:
        if external_id is not None:
            self.rows[external_id] = row

    def end(self) -> None:
        c = self.cols
        for correlation, ops in self.ops.items():
            call = self.calls.get(correlation)
            if call is None:
                continue  # launched outside the trace's CPU side: no range holds it
            thread, (call_start, _) = call
            for (start, end), name, stream in ops:
                for k, v in zip(c, (thread, call_start, start, end, name, stream)):
                    c[k].append(v)
        for external_id, (first, last) in self.spans.items():
            row = self.rows.get(external_id)
            if row is not None:
                for k, v in zip(self.span_rows, (row, first, last)):
                    self.span_rows[k].append(v)

    def work(self, kineto: bool, table):
        """The DeviceWork on the ranges of `table`, or None and why the trace has no device
        side."""
        if not kineto:
            return None, "a trace of host-side ranges (mmscope's chrome backend): no device side"
        if not self.seen_gpu:
            return None, ("no GPU activity in the torch trace (the profiler did not record "
                          "ProfilerActivity.CUDA)")
        # The span a trace states for a range (its gpu_user_annotation), where it states them.
        spans = (tuple(np.asarray(self.span_rows[k], np.int64) for k in ("rows", "first", "last"))
                 if self.span_rows["rows"] else None)
        return device.from_columns(table, self.cols, list(self.names), list(self.streams),
                                   "torch profiler (Kineto)", spans), ""
