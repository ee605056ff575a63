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
from mmscope.vocabulary import CONNECTOR, LAYER_OF, EncoderWay, Layer, Outcome, ProcessorWay

# Processor answers waiting for their items' engine outcome. An item waits from its processing
# until EngineCore commits it and sends the counts (at most a second later): this bounds what
# requests never scheduled (aborted first) leave behind; the oldest hash's answers go first.
MAX_WAITING = 65536
# Kinds of EncoderCosts' counts (wire form of carry/counts.py, labelled by modality)
ENCODER_NS, ENCODER_EMBEDS = "encoder_ns", "encoder_embeds"
EC_LOAD_NS, EC_LOAD_EMBEDS = "ec_load_ns", "ec_load_embeds"
# Kinds of a join's counts: items by modality, processor way and encoder way; ns saved by layer
ITEMS, SAVED_NS = "items", "saved_ns"


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
        self._sent: dict[str, set[int]] = {}  # request id -> its items whose way is out

    def committed(self, outcome: Outcome, item: Item, source: str | None) -> None:
        if outcome is Outcome.DEFERRED:
            return  # no outcome yet
        sent = self._sent.get(item.request_id)
        if sent is None:
            self._sent[item.request_id] = {item.index}
        elif item.index in sent:
            return
        else:
            sent.add(item.index)
        if outcome is Outcome.HIT:
            way = EncoderWay.EC_LOADED if source == CONNECTOR else EncoderWay.CACHE_HIT
        elif outcome is Outcome.MISS:
            way = EncoderWay.COMPUTED
        else:
            way = EncoderWay.PREFIX_COVERED
        self.ways.append((item.mm_hash or item.key, item.modality, way.value, item.embeds))

    def finished(self, request_id: str) -> None:
        self._sent.pop(request_id, None)

    @property
    def pending(self) -> bool:
        return bool(self.ways)

    def drain(self) -> list[tuple]:
        ways, self.ways = self.ways, []
        return ways


class EncoderCosts(counts.Counts):
    """What the encoder and the EC connector's loads cost on this engine since the last drain:
    a step's time shared among its items' modalities by embeddings."""

    def spent(self, ns_kind: str, embeds_kind: str, step_ns: int,
              items: Iterable[tuple[str, int]]) -> None:
        """`items`: (modality, embeddings) of what the step computed, or loaded."""
        by_modality: Counter = Counter()
        for modality, embeds in items:
            by_modality[modality] += embeds
        total = sum(by_modality.values())
        if step_ns <= 0 or not total:
            return
        for modality, embeds in by_modality.items():
            self.add(counts.key(ns_kind, modality), step_ns * embeds // total)
            self.add(counts.key(embeds_kind, modality), embeds)

    def encoded(self, step_ns: int, items: Iterable[tuple[str, int]]) -> None:
        self.spent(ENCODER_NS, ENCODER_EMBEDS, step_ns, items)

    def loaded(self, step_ns: int, items: Iterable[tuple[str, int]]) -> None:
        self.spent(EC_LOAD_NS, EC_LOAD_EMBEDS, step_ns, items)


# --- API server ---------------------------------------------------------------------------------
def prompt_hits(mm_hashes: dict[str, list[str]], is_cached: dict[str, list[bool]],
                held: Callable[[str], bool]) -> list[tuple[str, bool]]:
    """(hash, hit) of each item of a prompt, in the order vLLM gets them from its processor cache:
    a hit where the lookup found it, or where an earlier copy in the same prompt was added before
    it (`held` after the prompt: it fitted), as vLLM's own cache statistics count them."""
    seen: set[str] = set()
    out = []
    for modality, hashes in mm_hashes.items():
        flags = is_cached.get(modality, ())
        for i, mm_hash in enumerate(hashes):
            hit = bool(flags[i]) if i < len(flags) else False
            out.append((mm_hash, hit or (mm_hash in seen and held(mm_hash))))
            seen.add(mm_hash)
    return out


class ProcessorWays:
    """The processor cache's answers by item hash, oldest first, until EngineCore says where each
    item went. Written on vLLM's processor thread, read where the stats are recorded: one lock."""

    def __init__(self, bound: int = MAX_WAITING):
        self.bound = bound
        self.waiting = 0
        self._by_hash: dict[str, list[ProcessorWay]] = {}  # hashes in order of first answer
        self._lock = threading.Lock()

    def looked_up(self, answers: list[tuple[str, bool]]) -> None:
        hit, miss = ProcessorWay.HIT, ProcessorWay.MISS
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

    def take(self, hashes: Iterable[str]) -> list[ProcessorWay]:
        """For each hash in turn, the answer for its oldest waiting item; OFF where none waits:
        the cache is off, or vLLM did not look the item up."""
        out = []
        with self._lock:
            by_hash = self._by_hash
            for mm_hash in hashes:
                queue = by_hash.get(mm_hash)
                if queue is None:
                    out.append(ProcessorWay.OFF)
                    continue
                out.append(queue.pop(0))
                if not queue:
                    del by_hash[mm_hash]
            self.waiting -= sum(1 for way in out if way is not ProcessorWay.OFF)
        return out


class ProcessorCosts:
    """The HF processor's time per item, by modality: each call's time shared among the items it
    processed by count (a hit on the processor cache spares one item's)."""

    def __init__(self):
        self.ns: Counter = Counter()
        self.items: Counter = Counter()

    def processed(self, items: dict[str, int], ns: int) -> None:
        total = sum(items.values())
        if ns <= 0 or not total:
            return
        for modality, n in items.items():
            if n:
                self.ns[modality] += ns * n // total
                self.items[modality] += n

    def ns_per_item(self, modality: str) -> float:
        n = self.items[modality]
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
        if way == EncoderWay.EC_LOADED:
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
    items: Counter = Counter()  # (modality, processor way, encoder way) -> items
    embeds: Counter = Counter()  # (modality, encoder way) -> embeddings
    answers = processor.take([way[0] for way in ways])
    for (_, modality, encoder, n), answer in zip(ways, answers):
        items[(modality, answer, encoder)] += 1
        embeds[(modality, encoder)] += n
    found = {counts.key(ITEMS, m, p.value, e): n for (m, p, e), n in items.items()}
    saved: Counter = Counter()
    for (modality, answer, _), n in items.items():
        if answer is ProcessorWay.HIT:
            saved[Layer.PROCESSOR_CACHE] += round(n * hf.ns_per_item(modality))
    for (modality, encoder), n in embeds.items():
        layer = LAYER_OF.get(encoder)
        if layer is not None:
            saved[layer] += engine.saved_ns(encoder, modality, n)
    found.update({counts.key(SAVED_NS, layer.value): ns for layer, ns in saved.items()})
    return Joined(found, [(way[1], way[3]) for way in ways])


def item_keys(modalities: Iterable[str]) -> list[str]:
    """Every item count a model accepting `modalities` has, as wire keys."""
    return [counts.key(ITEMS, m, p.value, e.value) for m in modalities for p in ProcessorWay
            for e in EncoderWay]


def saved_keys() -> list[str]:
    return [counts.key(SAVED_NS, layer.value) for layer in Layer]
