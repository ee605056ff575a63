"""The encoder-cache model: for every access, the smallest capacity at which vLLM 0.32's eviction
rule would have hit it, for all capacities in one pass over a log; the curve is their distribution.
"""
# Why one pass is exact. vllm/v1/core/encoder_cache_manager.py never evicts an entry that a running
# request references, keeps unreferenced entries resident, and evicts them oldest-freed first, only
# when a new entry needs the space. So at capacity C the cache always holds the referenced
# ("pinned") entries plus the most recently freed entries that fit beside them, and an access to a
# freed entry hits iff  pinned + embeds of the entries freed since it (and still unreferenced) +
# its own embeds <= C.  That sum is its distance. tests/test_cache_size.py checks it against
# replay.py, a per-capacity simulation, on random logs.
#
# What the model simplifies:
# - release="access" (the default): a request's reference is dropped right after the access, so
#   the cache is an LRU by access in embeddings. vLLM drops it once the item's tokens are computed,
#   usually the same or the next step. release="end": held until the request's F line (finish or
#   preemption), which over-pins during decode (see README-cache-size.md for both against vLLM).
# - The log's order and concurrency are kept; at a smaller capacity vLLM would defer items for
#   lack of space. Where pinned entries alone leave no room the model admits the item over capacity
#   and trims back, oldest-freed first, as soon as references are released.
# - Connector hits stay hits at every capacity (the connector's store does not depend on the local
#   cache); the loaded item enters the local cache like a computed one.
# - Each engine is replayed on its own; the curve adds up their hits at the same capacity each.
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mmscope.cache_size.trace import CONNECTOR, FREE, Trace

COLD = np.iinfo(np.int64).max  # a first access: a miss at every capacity
RELEASES = ("access", "end")


@dataclass
class _Walk:
    """What the sequential pass leaves for the vectorised part."""

    distance: np.ndarray  # per access: 0 (pinned or connector), COLD, or filled in later
    released: list[int]  # embeds of each release, in release order
    starts: list[int]  # per closed interval (a freed entry used again): its release number
    closes: list[int]  # releases so far when it was used again
    pinned: list[int]  # pinned embeds at that moment
    access: list[int]  # the access it answers, or -1 (a connector hit: no query)


def distances(events, release: str = "access") -> np.ndarray:
    """One distance per access of one engine's events (int64; COLD for a first access)."""
    if release not in RELEASES:
        raise ValueError(f"release must be one of {RELEASES}")
    w = _walk(events, release == "end")
    if w.starts:
        starts = np.asarray(w.starts, np.int64)
        sizes = np.asarray(w.released, np.int64)
        cum = np.concatenate(([0], np.cumsum(sizes)))
        nested = _earlier_greater_sums(starts, sizes[starts])
        d = np.asarray(w.pinned, np.int64) + cum[np.asarray(w.closes)] - cum[starts] - nested
        access = np.asarray(w.access, np.int64)
        query = access >= 0
        w.distance[access[query]] = d[query]
    return w.distance


def _walk(events, hold_until_end: bool) -> _Walk:
    """The sequential part: who references what, and when each entry was freed and reused."""
    n = sum(1 for e in events if e[1] != FREE)
    w = _Walk(np.full(n, COLD, np.int64), [], [], [], [], [])
    refs: dict[int, set[int]] = {}  # pinned key -> requests referencing it
    size_of: dict[int, int] = {}
    held: dict[int, list[int]] = {}  # request -> keys it references, in access order
    open_at: dict[int, int] = {}  # freed key -> its release number
    released, pinned, i = w.released, 0, -1
    for req, key, embeds, outcome in events:
        if key == FREE:
            for k in held.pop(req, ()):
                holders = refs[k]
                holders.discard(req)
                if not holders:
                    del refs[k]
                    pinned -= size_of[k]
                    open_at[k] = len(released)
                    released.append(size_of[k])
            continue
        i += 1
        holders = refs.get(key)
        if holders is not None:
            w.distance[i] = 0
        else:
            start = open_at.pop(key, None)
            if start is not None:
                w.starts.append(start)
                w.closes.append(len(released))
                w.pinned.append(pinned)
                w.access.append(-1 if outcome == CONNECTOR else i)
            if outcome == CONNECTOR:
                w.distance[i] = 0
            size_of[key] = embeds
            if not hold_until_end:
                open_at[key] = len(released)
                released.append(embeds)
                continue
            holders = refs[key] = set()
            pinned += embeds
        if req not in holders:
            holders.add(req)
            held.setdefault(req, []).append(key)
    return w


def _earlier_greater_sums(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """out[i] = sum of weights[j] over j < i with values[j] > values[i] (values distinct):
    the embeds of entries freed after entry i and used again before it. A bottom-up merge sort,
    vectorised per level: log2(n) rounds of numpy work instead of n tree updates in Python."""
    n = len(values)
    out = np.zeros(n, np.int64)
    if n < 2:
        return out
    big = int(values.max()) + 1
    vals, idx, wts = values.astype(np.int64), np.arange(n), weights.astype(np.int64)
    pos = np.arange(n)
    width = 1
    while width < n:
        pair = pos // (2 * width)
        right = ((pos // width) & 1).astype(bool)
        key = pair * big + vals  # blocks of `width` are sorted: left halves ascending overall
        left_keys = key[~right]
        left_cum = np.concatenate(([0], np.cumsum(wts[~right])))
        lo = np.searchsorted(left_keys, key[right], "right")
        hi = np.searchsorted(left_keys, (pair[right] + 1) * big, "left")
        out[idx[right]] += left_cum[hi] - left_cum[lo]
        order = np.argsort(key, kind="stable")
        vals, idx, wts = vals[order], idx[order], wts[order]
        width *= 2
    return out


@dataclass
class Curve:
    """Hit rate against capacity (embeds) for a whole log: all engines' distances together."""

    distances: np.ndarray  # sorted ascending; COLD at the end
    largest_item: int
    recorded_capacity: int | None
    recorded_hits: int
    engines: int
    release: str

    @property
    def queries(self) -> int:
        return len(self.distances)

    @property
    def repeats(self) -> int:
        """Accesses that hit at some capacity (every one, once the cache holds everything)."""
        return int(np.searchsorted(self.distances, COLD, "left"))

    @property
    def saturation(self) -> int:
        """The smallest capacity from which every repeat hits: the hit rate grows no further."""
        r = self.repeats
        return max(self.largest_item, int(self.distances[r - 1]) if r else 0)

    def hits(self, capacity: int) -> int:
        return int(np.searchsorted(self.distances, capacity, "right"))

    def hit_rate(self, capacity: int) -> float:
        return self.hits(capacity) / self.queries

    def capacity_for(self, target: float) -> int | None:
        """The smallest capacity (never below the largest item) reaching `target`, or None."""
        need = math.ceil(target * self.queries - 1e-9)
        if need > self.repeats:
            return None
        if need <= 0:
            return self.largest_item
        return max(self.largest_item, int(self.distances[need - 1]))

    def default_grid(self) -> list[int]:
        """The largest item, powers of two up to the saturation capacity, it, and the recorded
        capacity."""
        lo, hi = self.largest_item, self.saturation
        grid = {lo, hi}
        p = 1 << max(lo - 1, 1).bit_length()
        while p < hi:
            grid.add(p)
            p <<= 1
        if self.recorded_capacity:
            grid.add(self.recorded_capacity)
        return sorted(grid)


def curve(trace: Trace, release: str = "access") -> Curve:
    """Replay each engine of the log on its own; pool their accesses (hits add up)."""
    parts = [distances(e.events, release) for e in trace.engines.values()]
    capacities = {e.capacity for e in trace.engines.values() if e.capacity}
    return Curve(
        distances=np.sort(np.concatenate(parts)),
        largest_item=max(e.largest_item for e in trace.engines.values()),
        recorded_capacity=max(capacities) if capacities else None,
        recorded_hits=sum(e.hits for e in trace.engines.values()),
        engines=len(trace.engines),
        release=release)
