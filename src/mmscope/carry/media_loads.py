"""What the API server learns of each multimodal item before the processor (docs/design.md §3,
§5): the fetch and the decode of its media, the bytes fetched, the fetches that failed, and the
fetches vLLM's processor cache made pointless; and, per render, the wall time of its items.

Independent of vLLM: the adapter (vllm/api_server/media_items.py) feeds it items and the
cache's lookups.
"""
from __future__ import annotations

import functools
from collections import OrderedDict

from mmscope import stages
from mmscope.carry import counts

# Bounds on what waits for its other half (a render's requests, a lookup's hashes).
MAX_PENDING = 4096
# Kinds of the per-process counts (carry/counts.py), labelled by source and modality (failures
# by step, source and modality).
BYTES, FAILED, CACHED, CACHED_NS = "bytes", "failed", "cached", "cached_ns"


def source_of(url: str) -> str | None:
    """The source of a media URL as vLLM's MediaConnector tells them apart (None: it refuses)."""
    head = url[:8].lower()
    if head.startswith("data:"):
        return "data_url"
    if head.startswith(("http://", "https://")):
        return "http"
    if head.startswith("file:"):
        return "file"
    return None


class Item:
    """One item being loaded: where from, what it is, when it started (ns), when its bytes were
    in hand (the decode's start; None while fetching), the bytes and the decode's range."""

    __slots__ = ("source", "modality", "start_ns", "fetched_ns", "bytes", "fetch_range",
                 "fetch_stage", "decode_stage")

    def __init__(self, source: str, modality: str, start_ns: int, fetch_range=None):
        self.source, self.modality, self.start_ns = source, modality, start_ns
        self.fetched_ns: int | None = None
        self.bytes = 0
        self.fetch_range = fetch_range  # tracing's interval while tracing, else None
        self.fetch_stage, self.decode_stage = _stages(source, modality)


@functools.cache
def _stages(source: str, modality: str) -> tuple[str, str]:
    """An item's fetch and decode stage names, made once per source and modality."""
    return (stages.media_range(stages.MEDIA_FETCH, source, modality),
            stages.media_range(stages.MEDIA_DECODE, source, modality))


_key = functools.cache(counts.key)  # the wire keys of a few sources and modalities, made once


class Render:
    """One render of vLLM's (a chat request, or an offline batch rendered at once): its items'
    load intervals and costs in the order they started, the multimodal processor's intervals,
    and how many of its requests have yet to leave the API server."""

    __slots__ = ("media", "processor", "loaded", "requests")

    def __init__(self):
        self.media: list[tuple[int, int]] = []
        self.processor: list[tuple[int, int]] = []
        self.loaded: dict[str, list[tuple[str, int]]] = {}  # modality -> [(source, ns)]
        self.requests = 0

    def item_loaded(self, item: Item, end_ns: int) -> None:
        self.media.append((item.start_ns, end_ns))
        self.loaded.setdefault(item.modality, []).append((item.source, end_ns - item.start_ns))

    def media_s(self) -> float:
        return wall_ns(self.media) / 1e9

    def processor_s(self) -> float:
        return wall_ns(self.processor) / 1e9

    def take_loaded(self, modality: str, n: int) -> list[tuple[str, int]] | None:
        """The next `n` items of `modality` loaded, in the order the processor sees them; None
        when fewer were loaded (items given as objects, not URLs): then none are matched."""
        queue = self.loaded.get(modality, [])
        if len(queue) < n:
            self.loaded[modality] = []
            return None
        taken, self.loaded[modality] = queue[:n], queue[n:]
        return taken


def wall_ns(intervals: list[tuple[int, int]]) -> int:
    """The length of the union of intervals: items loaded at once count once."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


class MediaCounts(counts.Counts):
    """The API server's media counts, and each item's size, drained into Prometheus with its
    stage durations."""

    def __init__(self):
        super().__init__()
        self.sizes: list[tuple[str, str, int]] = []  # (source, modality, bytes) of each item

    def loaded(self, item: Item) -> None:
        self.add(_key(BYTES, item.source, item.modality), item.bytes)
        self.sizes.append((item.source, item.modality, item.bytes))

    def take_sizes(self) -> list[tuple[str, str, int]]:
        sizes, self.sizes = self.sizes, []
        return sizes

    def failed(self, item: Item) -> None:
        """The load raised: in the fetch (no bytes: refused, HTTP error, bad URL) or in the
        decode (bytes that are no media of that kind)."""
        step = stages.MEDIA_DECODE if item.fetched_ns is not None else stages.MEDIA_FETCH
        self.add(counts.key(FAILED, step, item.source, item.modality), 1)

    def cached(self, modality: str, source: str, ns: int) -> None:
        """An item fetched and decoded although the processor cache held its content."""
        self.add(counts.key(CACHED, source, modality), 1)
        self.add(counts.key(CACHED_NS, source, modality), ns)


def match_cached(render: Render, hashes: dict[str, list], is_cached: dict[str, list[bool]],
                 counts: MediaCounts) -> None:
    """A prompt's items, per modality in order, against the processor cache's answers for their
    hashes: each one it held was fetched and decoded for nothing."""
    for modality, flags in is_cached.items():
        loaded = render.take_loaded(modality, len(hashes.get(modality, ())))
        if loaded is None:
            continue
        for (source, ns), cached in zip(loaded, flags):
            if cached:
                counts.cached(modality, source, ns)


class Lookups:
    """The processor cache's answers, by the identity of the hashes' dict the processor returns
    with its output (the same object), until the prompt's render reads them."""

    def __init__(self):
        self.found: OrderedDict[int, dict[str, list[bool]]] = OrderedDict()

    def looked_up(self, hashes: dict, is_cached: dict[str, list[bool]]) -> None:
        self.found[id(hashes)] = is_cached
        if len(self.found) > MAX_PENDING:
            self.found.popitem(last=False)

    def take(self, hashes: dict) -> dict[str, list[bool]] | None:
        return self.found.pop(id(hashes), None)
