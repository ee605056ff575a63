"""Load a Chrome trace-event file (mmscope's `chrome` backend, torch profiler) into a RangeTable.

X and B/E events become ranges, instants marks (gzip, bare lists too); each file's clock is
known (torch: its UTC base time; mmscope: CLOCK_MONOTONIC) and a folder is read on one clock.
"""
from __future__ import annotations

import gzip
import os
from dataclasses import dataclass

from mmscope.analyze import table as tbl
from mmscope.analyze import torch_frames
from mmscope.errors import UserError
from mmscope.emit.chrome import read_events

GZIP_MAGIC = b"\x1f\x8b"
# The torch profiler's categories of the ranges a program names (record_function); the others
# (python_function, cpu_op, kernel, ...) are what it records by itself: frames, not stages.
TORCH_STAGES = (None, "user_annotation", "gpu_user_annotation")
_ID_LIMIT = 1 << 24  # pid and tid each get 24 bits of the nsys-style thread key
_INSTANTS = ("i", "I", "R")


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
        args = ev.get("args") or {}
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
    parsed = []
    for p in paths:
        doc = _parse(p)
        events = _events(p, doc)
        parsed.append((p, events, clock_of(doc, events)))
    shifts, clock = _alignment(parsed, label)
    builder = _Builder()
    try:
        for (_, events, file_clock), shift in zip(parsed, shifts):
            builder.shift = shift
            builder.torch = file_clock.domain == TORCH
            for ev in events:
                builder.add(ev)
        return torch_frames.settle(builder.table(clock))
    except (TypeError, ValueError, OverflowError) as e:
        raise UserError(f"{label}: malformed trace event ({_first_line(e)})") from None


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
        self.cols: dict[str, list] = {k: [] for k in ("name", "start", "end", "kind", "thread",
                                                      "frame")}
        self.ids: dict[tuple[str, object], int] = {}
        self.thread_names: dict[int, str] = {}
        self.process_names: dict[int, str] = {}
        self.open: dict[int, list[int]] = {}
        self.shift = 0  # added to this file's times (ns): its place on the profile's clock
        self.torch = False  # a torch profiler trace: its own frames are told from the stages

    def table(self, clock: str) -> tbl.RangeTable:
        c = self.cols
        return tbl.build(raw_names=list(self.names), name_id=c["name"], start=c["start"],
                         end=c["end"], kind=c["kind"], thread=c["thread"],
                         frame=c["frame"] if any(c["frame"]) else None,
                         thread_names=self.thread_names, process_names=self.process_names,
                         source="chrome-json", clock=clock)

    def add(self, ev: dict) -> None:
        ph = ev.get("ph")
        if ph == "M":
            self.metadata(ev)
        elif ph == "X" and "ts" in ev:
            start = _ns(ev["ts"]) + self.shift
            self.row(ev, start, start + _ns(ev.get("dur", 0)), tbl.PUSH_POP)
        elif ph == "B" and "ts" in ev:
            self.open.setdefault(self.thread(ev), []).append(
                self.row(ev, _ns(ev["ts"]) + self.shift, None, tbl.PUSH_POP))
        elif ph == "E" and "ts" in ev:
            stack = self.open.get(self.thread(ev))
            if stack:  # an E without its B (cut by the capture window) is dropped
                self.cols["end"][stack.pop()] = _ns(ev["ts"]) + self.shift
        elif ph in _INSTANTS and "ts" in ev:
            t = _ns(ev["ts"]) + self.shift
            self.row(ev, t, t, tbl.MARK)

    def row(self, ev: dict, start: int, end: int | None, kind: int) -> int:
        c = self.cols
        name = str(ev.get("name", ""))
        c["name"].append(self.names.setdefault(name, len(self.names)))
        c["start"].append(start)
        # No E (yet): build() reads an end before the start as "unclosed".
        c["end"].append(start - 1 if end is None else max(end, start))
        c["kind"].append(kind)
        c["thread"].append(self.thread(ev))
        c["frame"].append(self.torch and ev.get("cat") not in TORCH_STAGES)
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
        name = (ev.get("args") or {}).get("name")
        if not isinstance(name, str):
            return
        if ev.get("name") == "thread_name":
            self.thread_names[self.thread(ev)] = name
        elif ev.get("name") == "process_name":
            self.process_names[self.key("pid", ev.get("pid", 0))] = name
