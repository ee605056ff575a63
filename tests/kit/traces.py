"""Read the Chrome trace files that mmscope's `chrome` backend wrote, for assertions."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
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


def analyzed_stages(trace_dir) -> set[str]:
    """`mmscope analyze --json` of a folder of traces, as a user runs it: every check ok, every
    step's step_meta joined with its forward; the names of the stages it found."""
    done = subprocess.run([sys.executable, "-m", "mmscope.cli", "analyze", "--json",
                           "--no-cache", str(trace_dir)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert all(c["ok"] for c in doc["checks"]), doc["checks"]
    assert doc["steps"]["pairs"] == doc["steps"]["forwards"] > 0
    return {s["name"] for s in doc["stages"]}
