"""The wire form of mmscope's counts between processes: a flat dict[str, int] keyed `<kind>` or
`<kind>:<label>:...`, which msgspec and pickle carry untouched and the API server adds up.

One codec: the counters write keys with `key()`, the series (expose/metrics.py) read them back
with `split()`; `Counts` is a process's counts of one family until they are drained.
"""
from __future__ import annotations

import threading

SEP = ":"


def key(kind: str, *labels: str) -> str:
    return SEP.join((kind, *labels)) if labels else kind


def split(wire_key: str) -> tuple[str, list[str]]:
    """(kind, label values) of a wire key."""
    kind, *labels = wire_key.split(SEP)
    return kind, labels


class Counts:
    """Counts since the last drain, per process. Several threads add (the API server's event
    loop and vLLM's media threads): one lock."""

    def __init__(self):
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, wire_key: str, n: int) -> None:
        with self._lock:
            self.counts[wire_key] = self.counts.get(wire_key, 0) + n

    def merge(self, more: dict[str, int] | None) -> None:
        """Counts another process sent."""
        for wire_key, n in (more or {}).items():
            self.add(wire_key, n)

    @property
    def pending(self) -> bool:
        return bool(self.counts)

    def drain(self) -> dict[str, int]:
        with self._lock:
            drained, self.counts = self.counts, {}
        return drained
