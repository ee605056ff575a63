"""Each multimodal item's way through the cache layers (docs/design.md §4b): what vLLM's processor
cache did for it, joined by the item's hash with where its embeddings came from; and the work each
layer saved, from the skipped stage's measured cost.

Independent of vLLM: EngineCore feeds `EngineWays` and `EncoderCosts`, the API server
`ProcessorWays` and `ProcessorCosts`, and `join` meets them where the series are made.
"""
from __future__ import annotations

import threading
from collections import Counter
from typing import Callable, Iterable, NamedTuple

from mmscope.carry import counts
from mmscope.carry.ledger import Item
from mmscope.vocabulary import (CONNECTOR, HIT_SOURCES, LAYER_OF, EncoderWay, Layer, Outcome,
                                ProcessorWay)

# Processor answers waiting for their items' engine outcome. An item waits from its processing
# until EngineCore commits it and sends the counts (at most a second later): this bounds what
# requests never scheduled (aborted first) leave behind; the oldest hash's answers go first.
MAX_WAITING = 65536
# Kinds of EncoderCosts' counts (wire form of carry/counts.py, labelled by modality)
ENCODER_NS, ENCODER_EMBEDS = "encoder_ns", "encoder_embeds"
EC_LOAD_NS, EC_LOAD_EMBEDS = "ec_load_ns", "ec_load_embeds"
EMBEDS_OF = {ENCODER_NS: ENCODER_EMBEDS, EC_LOAD_NS: EC_LOAD_EMBEDS}
# Kinds of a join's counts: items by modality, processor way and encoder way; ns saved by layer
ITEMS, SAVED_NS = "items", "saved_ns"
# The ways as plain strings where each item passes: an enum's member is a class attribute that
# costs ten times a module constant's lookup in CPython 3.11, its `.value` more
_HIT, _MISS, _OFF = (str(w) for w in (ProcessorWay.HIT, ProcessorWay.MISS, ProcessorWay.OFF))
_EC_LOADED = str(EncoderWay.EC_LOADED)
# (committed outcome, hit source) -> encoder way; a deferral has none
_ENCODER_WAY = {(Outcome.MISS, None): str(EncoderWay.COMPUTED),
                (Outcome.PREFIX_COVERED, None): str(EncoderWay.PREFIX_COVERED),
                (Outcome.HIT, CONNECTOR): _EC_LOADED,
                **{(Outcome.HIT, s): str(EncoderWay.CACHE_HIT) for s in HIT_SOURCES
                   if s != CONNECTOR}}
_LAYER_OF = {str(way): str(layer) for way, layer in LAYER_OF.items()}


class Way(NamedTuple):
    """One item at its final outcome, as EngineCore sends it (a plain tuple on the wire)."""

    mm_hash: str  # the processor's hash of the item (the encoder cache's key less a LoRA prefix)
    modality: str
    encoder: str  # an EncoderWay
    embeds: int


# --- EngineCore ---------------------------------------------------------------------------------
class EngineWays:
    """The items committed since the last drain, in commit order: the ledger's sink. A request
    preempted and resumed commits its items again (docs/design.md §4); their way is sent once."""

    def __init__(self):
        self.ways: list[tuple] = []
        self._resumed: dict[str, set[int]] = {}  # preempted request -> its items already sent

    def committed(self, outcome: Outcome, item: Item, source: str | None) -> None:
        way = _ENCODER_WAY.get((outcome, source))
        if way is None:
            return  # a deferral: no outcome yet
        if self._resumed:
            sent = self._resumed.get(item.request_id)
            if sent is not None and item.index in sent:
                return
        self.ways.append((item.mm_hash or item.key, item.modality, way, item.embeds))

    def preempted(self, request_id: str, committed: set[int]) -> None:
        """The request's entries were freed before it finished: the items it committed so far
        will be committed again when it resumes."""
        if committed:
            self._resumed.setdefault(request_id, set()).update(committed)

    def finished(self, request_id: str) -> None:
        if self._resumed:
            self._resumed.pop(request_id, None)

    @property
    def pending(self) -> bool:
        return bool(self.ways)

    def drain(self) -> list[tuple]:
        ways, self.ways = self.ways, []
        return ways


class EncoderCosts:
    """What the encoder and the EC connector's loads cost on this engine since the last drain:
    a step's time shared among its items' modalities by embeddings. Written by the scheduler's
    thread only."""

    def __init__(self):
        self.spent: dict[tuple[str, str], list[int]] = {}  # (ns kind, modality) -> [ns, embeds]

    def add(self, ns_kind: str, step_ns: int, items: Iterable[tuple[str, int]]) -> None:
        """`items`: (modality, embeddings) of what the step computed, or loaded."""
        if step_ns <= 0:
            return
        by_modality: dict[str, int] = {}
        for modality, embeds in items:
            by_modality[modality] = by_modality.get(modality, 0) + embeds
        total = sum(by_modality.values())
        for modality, embeds in by_modality.items():
            spent = self.spent.get((ns_kind, modality))
            if spent is None:
                spent = self.spent[(ns_kind, modality)] = [0, 0]
            spent[0] += step_ns * embeds // total
            spent[1] += embeds

    def encoded(self, step_ns: int, items: Iterable[tuple[str, int]]) -> None:
        self.add(ENCODER_NS, step_ns, items)

    def loaded(self, step_ns: int, items: Iterable[tuple[str, int]]) -> None:
        self.add(EC_LOAD_NS, step_ns, items)

    @property
    def pending(self) -> bool:
        return bool(self.spent)

    def drain(self) -> dict[str, int]:
        """The wire form (carry/counts.py): `encoder_ns:<modality>`, `encoder_embeds:...`, ..."""
        spent, self.spent = self.spent, {}
        wire = {}
        for (kind, modality), (ns, embeds) in spent.items():
            wire[counts.key(kind, modality)] = ns
            wire[counts.key(EMBEDS_OF[kind], modality)] = embeds
        return wire


# --- API server ---------------------------------------------------------------------------------
def prompt_hits(mm_hashes: dict[str, list[str]], is_cached: dict[str, list[bool]],
                held: Callable[[str], bool]) -> list[tuple[str, bool]]:
    """(hash, hit) of each item of a prompt, in the order vLLM gets them from its processor cache:
    a hit where the lookup found it, or where an earlier copy in the same prompt was added before
    it (`held` after the prompt: it fitted), as vLLM's own cache statistics count them."""
    out: list[tuple[str, bool]] = []
    for modality, hashes in mm_hashes.items():
        out += zip(hashes, is_cached[modality])
    if len(out) > 1:
        seen: set[str] = set()
        for i, (mm_hash, hit) in enumerate(out):
            if not hit and mm_hash in seen and held(mm_hash):
                out[i] = (mm_hash, True)
            seen.add(mm_hash)
    return out


class ProcessorWays:
    """The processor cache's answers by item hash, oldest first, until EngineCore says where each
    item went. Written on vLLM's processor thread, read where the stats are recorded: one lock."""

    def __init__(self, bound: int = MAX_WAITING):
        self.bound = bound
        self.waiting = 0
        self._by_hash: dict[str, list[str]] = {}  # hashes in order of first answer
        self._lock = threading.Lock()

    def looked_up(self, answers: list[tuple[str, bool]]) -> None:
        hit, miss = _HIT, _MISS
        with self._lock:
            by_hash = self._by_hash
            for mm_hash, found in answers:
                queue = by_hash.get(mm_hash)
                if queue is None:
                    by_hash[mm_hash] = [hit if found else miss]
                else:
                    queue.append(hit if found else miss)
            self.waiting += len(answers)
            while self.waiting > self.bound:
                self.waiting -= len(by_hash.pop(next(iter(by_hash))))

    def take(self, hashes: Iterable[str]) -> list[str]:
        """For each hash in turn, the answer (a ProcessorWay) for its oldest waiting item; off
        where none waits: the cache is off, or vLLM did not look the item up."""
        out = []
        taken = 0
        with self._lock:
            by_hash = self._by_hash
            for mm_hash in hashes:
                queue = by_hash.get(mm_hash)
                if queue is None:
                    out.append(_OFF)
                    continue
                out.append(queue.pop(0))
                taken += 1
                if not queue:
                    del by_hash[mm_hash]
            self.waiting -= taken
        return out


class ProcessorCosts:
    """The HF processor's time per item, by modality: each call's time shared among the items it
    processed by count (a hit on the processor cache spares one item's)."""

    def __init__(self):
        self.ns: dict[str, int] = {}
        self.items: dict[str, int] = {}

    def processed(self, items: dict[str, int], ns: int) -> None:
        total = sum(items.values())
        if ns <= 0 or not total:
            return
        for modality, n in items.items():
            if n:
                self.ns[modality] = self.ns.get(modality, 0) + ns * n // total
                self.items[modality] = self.items.get(modality, 0) + n

    def ns_per_item(self, modality: str) -> float:
        n = self.items.get(modality)
        return self.ns[modality] / n if n else 0.0


class EngineCostTotals:
    """One engine's EncoderCosts added up since its start: the encoder's and the EC load's
    nanoseconds per embedding, by modality."""

    def __init__(self):
        self.totals: Counter = Counter()

    def add(self, wire: dict[str, int] | None) -> None:
        self.totals.update(wire or {})

    def per_embed(self, ns_kind: str, embeds_kind: str, modality: str) -> float:
        embeds = self.totals[counts.key(embeds_kind, modality)]
        return self.totals[counts.key(ns_kind, modality)] / embeds if embeds else 0.0

    def encoder_ns_per_embed(self, modality: str) -> float:
        return self.per_embed(ENCODER_NS, ENCODER_EMBEDS, modality)

    def modalities(self) -> list[str]:
        return sorted({counts.split(k)[1][0] for k in self.totals
                       if counts.split(k)[0] == ENCODER_EMBEDS})

    def saved_ns(self, way: str, modality: str, embeds: int) -> int:
        """The encoder's time for `embeds` of that modality on this engine (none measured yet:
        0), less, for an EC load, the load's."""
        encoder = embeds * self.encoder_ns_per_embed(modality)
        if way == _EC_LOADED:
            encoder -= embeds * self.per_embed(EC_LOAD_NS, EC_LOAD_EMBEDS, modality)
        return max(0, round(encoder))


class Joined(NamedTuple):
    """A batch of items joined: counts (wire form: `items:<modality>:<processor>:<encoder>`,
    `saved_ns:<layer>`) and each item's (modality, embeddings)."""

    counts: dict[str, int]
    sizes: list[tuple[str, int]]


def join(ways: list[tuple], processor: ProcessorWays, hf: ProcessorCosts,
         engine: EngineCostTotals) -> Joined:
    """Each item EngineCore sent, with the processor's answer for its hash, and the work its
    layers saved: a processor-cache hit the HF processor's mean time per item of its modality, an
    encoder-cache hit or a prefix-covered item the encoder's time for its embeddings, an EC load
    that less the load's."""
    items: dict[tuple[str, str, str], int] = {}  # (modality, processor way, encoder way) -> n
    embeds: dict[tuple[str, str], int] = {}  # (modality, encoder way) -> embeddings
    for (_, modality, encoder, n), answer in zip(ways, processor.take([w[0] for w in ways])):
        key = (modality, answer, encoder)
        items[key] = items.get(key, 0) + 1
        key = (modality, encoder)
        embeds[key] = embeds.get(key, 0) + n
    found = {counts.key(ITEMS, *key): n for key, n in items.items()}
    saved: dict[str, int] = {}
    for (modality, answer, _), n in items.items():
        if answer == _HIT:
            layer = str(Layer.PROCESSOR_CACHE)
            saved[layer] = saved.get(layer, 0) + round(n * hf.ns_per_item(modality))
    for (modality, encoder), n in embeds.items():
        layer = _LAYER_OF.get(encoder)
        if layer is not None:
            saved[layer] = saved.get(layer, 0) + engine.saved_ns(encoder, modality, n)
    found.update({counts.key(SAVED_NS, layer): ns for layer, ns in saved.items()})
    return Joined(found, [(w[1], w[3]) for w in ways])


def item_keys(modalities: Iterable[str]) -> list[str]:
    """Every item count a model accepting `modalities` has, as wire keys."""
    return [counts.key(ITEMS, m, p, e) for m in modalities for p in ProcessorWay
            for e in EncoderWay]


def saved_keys() -> list[str]:
    return [counts.key(SAVED_NS, layer) for layer in Layer]
