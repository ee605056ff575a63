"""Load a Chrome trace-event file (mmscope's `chrome` backend, torch profiler) into a RangeTable.

Complete ("X") and begin/end ("B"/"E") events become ranges, instants marks; gzip, bare lists too.
"""
from __future__ import annotations

import gzip
import json

from mmscope.analyze import table as tbl
from mmscope.errors import UserError
from mmscope.emit.chrome import read_events

GZIP_MAGIC = b"\x1f\x8b"
_ID_LIMIT = 1 << 24  # pid and tid each get 24 bits of the nsys-style thread key
_INSTANTS = ("i", "I", "R")


def looks_like_json(head: bytes) -> bool:
    return head.startswith(GZIP_MAGIC) or head.lstrip()[:1] in (b"{", b"[")


def load(path: str) -> tbl.RangeTable:
    return load_all([path], path)


def load_all(paths: list[str], label: str) -> tbl.RangeTable:
    """Several trace files as one table: the chrome backend writes one file per process."""
    events = [e for p in paths for e in _events(p, _parse(p))]
    try:
        return _Builder().run(events)
    except (TypeError, ValueError, OverflowError) as e:
        raise UserError(f"{label}: malformed trace event ({_first_line(e)})") from None


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

    def run(self, events: list) -> tbl.RangeTable:
        for ev in events:
            self.add(ev)
        c = self.cols
        return tbl.build(raw_names=list(self.names), name_id=c["name"], start=c["start"],
                         end=c["end"], kind=c["kind"], thread=c["thread"],
                         thread_names=self.thread_names, process_names=self.process_names,
                         source="chrome-json")

    def add(self, ev: dict) -> None:
        ph = ev.get("ph")
        if ph == "M":
            self.metadata(ev)
        elif ph == "X" and "ts" in ev:
            start = _ns(ev["ts"])
            self.row(ev, start, start + _ns(ev.get("dur", 0)), tbl.PUSH_POP)
        elif ph == "B" and "ts" in ev:
            self.open.setdefault(self.thread(ev), []).append(
                self.row(ev, _ns(ev["ts"]), None, tbl.PUSH_POP))
        elif ph == "E" and "ts" in ev:
            stack = self.open.get(self.thread(ev))
            if stack:  # an E without its B (cut by the capture window) is dropped
                self.cols["end"][stack.pop()] = _ns(ev["ts"])
        elif ph in _INSTANTS and "ts" in ev:
            t = _ns(ev["ts"])
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
