"""Events a reader skips because they are malformed (a negative or missing duration, an end before
its begin, an end without its begin, a name that is not text): never read as a 0 ns range, but
counted, with the first one said, for the report's line and its check.
"""
from __future__ import annotations

from dataclasses import dataclass

CHECK = "events are well formed (malformed ones skipped)"
MOSTLY = 0.5  # a profile whose events are more than this share malformed fails the check


@dataclass
class Skipped:
    """How many events were skipped of how many read, and the first one as a person finds it."""

    count: int = 0
    events: int = 0
    first: str = ""

    def add(self, what: str) -> None:
        if not self.count:
            self.first = what
        self.count += 1

    def doc(self) -> dict:
        return {"skipped": self.count, "events": self.events, "first": self.first or None}


def nsys_said(count: int, row: int, start, end, thread, names: list[str], name_code,
              events: int) -> Skipped:
    """The NVTX rows that are ranges or marks with no start, or an end before their start:
    how many, and the first (`row`) as a person finds it (numpy columns)."""
    import numpy as np

    said = Skipped(count=count, events=events)
    if said.count:
        t = int(thread[row])
        what = ("no start" if start[row] == np.iinfo(np.int64).min else
                f"ends at {int(end[row])} ns, before its start {int(start[row])} ns")
        said.first = (f"'{names[int(name_code[row])]}' on pid {(t >> 24) & 0xFFFFFF} tid "
                      f"{t & 0xFFFFFF}: {what}")
    return said


def line(m: dict) -> str | None:
    """The report's one line on what was skipped (None: nothing)."""
    if not m or not m["skipped"]:
        return None
    return (f"skipped {m['skipped']} malformed of {m['events']} events; first: {m['first']}")


def check(m: dict) -> dict | None:
    """The check on them, where any was skipped: not ok where most events were malformed."""
    if not m or not m["skipped"]:
        return None
    ok = m["skipped"] <= MOSTLY * m["events"]
    return {"name": CHECK, "ok": ok,
            "detail": (f"{m['skipped']} of {m['events']} events skipped as malformed"
                       + ("" if ok else ", most of the profile") + f"; first: {m['first']}")}
