"""The reference simulation: one capacity at a time, vLLM 0.32's EncoderCacheManager bookkeeping
(cached / freeable / references) with the model's simplifications, for tests and the benchmark.

`model.distances` must agree with it at every capacity; it is the slow, obvious version.
"""
from __future__ import annotations

from collections import OrderedDict

from mmscope.cache_size.trace import CONNECTOR, FREE


class _Cache:
    def __init__(self, capacity: int):
        self.capacity, self.used = capacity, 0
        self.cached: dict[int, set[int]] = {}  # key -> requests referencing it
        self.size: dict[int, int] = {}
        self.freeable: OrderedDict[int, int] = OrderedDict()  # oldest freed first

    def access(self, req: int, key: int, embeds: int) -> bool:
        """check_and_update_cache, else can_allocate + allocate (admitted even over capacity)."""
        holders = self.cached.get(key)
        if holders is not None:
            if not holders:
                self.freeable.pop(key)
            holders.add(req)
            return True
        self.evict_until(self.capacity - embeds)
        self.cached[key], self.size[key] = {req}, embeds
        self.used += embeds
        return False

    def release(self, req: int, key: int) -> None:
        holders = self.cached.get(key)
        if holders is None or req not in holders:
            return
        holders.discard(req)
        if not holders:
            self.freeable[key] = self.size[key]

    def evict_until(self, limit: int) -> None:
        while self.used > limit and self.freeable:
            key, embeds = self.freeable.popitem(last=False)
            del self.cached[key], self.size[key]
            self.used -= embeds


def replay(events, capacity: int, release: str = "access") -> list[bool]:
    """Hit or miss per access of one engine's events at one capacity."""
    cache, held, hits = _Cache(capacity), {}, []
    for req, key, embeds, outcome in events:
        if key == FREE:
            for k in held.pop(req, ()):
                cache.release(req, k)
            cache.evict_until(capacity)  # trim what an over-capacity admission left
            continue
        hits.append(cache.access(req, key, embeds) or outcome == CONNECTOR)
        if release == "access":
            cache.release(req, key)
            cache.evict_until(capacity)
        else:
            held.setdefault(req, []).append(key)
    return hits
