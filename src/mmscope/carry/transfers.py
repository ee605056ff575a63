"""The EC connector's transfers, per process: items, bytes and host nanoseconds moved, by
direction, in the wire form of carry/counts.py (`items:load`, `ns:save`, ...).

Filled by the worker's wrappers, and in EngineCore by what a worker process sent.
"""
from __future__ import annotations

from mmscope.carry import counts

ITEMS, BYTES, NS = "items", "bytes", "ns"
LOAD, SAVE = "load", "save"
DIRECTIONS = (LOAD, SAVE)


class TransferCounts(counts.Counts):
    def moved(self, direction: str, items: int, nbytes: int, ns: int) -> None:
        for kind, n in ((ITEMS, items), (BYTES, nbytes), (NS, ns)):
            self.add(counts.key(kind, direction), n)


TRANSFERS = TransferCounts()
