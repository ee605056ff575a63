"""Read the Chrome trace files that mmscope's `chrome` backend wrote, for assertions."""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass

from mmscope.emit.chrome import read_events


@dataclass(frozen=True)
class Range:
    name: str
    start: float  # microseconds
    end: float
    pid: int
    tid: int


def load(trace_dir) -> tuple[list[Range], dict[tuple[int, int], str]]:
    ranges, threads = [], {}
    for path in glob.glob(os.path.join(str(trace_dir), "*.trace.json")):
        with open(path) as f:
            doc = read_events(f.read())
        for e in doc:
            if e["ph"] == "X":
                ranges.append(Range(e["name"], e["ts"], e["ts"] + e["dur"], e["pid"], e["tid"]))
            elif e["ph"] == "M" and e["name"] == "thread_name":
                threads[(e["pid"], e["tid"])] = e["args"]["name"]
    ranges.sort(key=lambda r: (r.start, -r.end))
    return ranges, threads


def named(ranges, name):
    return [r for r in ranges if r.name == name]


def within(inner: Range, outer: Range) -> bool:
    return (inner.pid, inner.tid) == (outer.pid, outer.tid) and \
        outer.start <= inner.start and inner.end <= outer.end


def parent_of(r: Range, candidates) -> Range | None:
    inside = [c for c in candidates if c is not r and within(r, c)]
    return min(inside, key=lambda c: c.end - c.start) if inside else None
