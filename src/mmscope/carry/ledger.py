"""Encoder-cache accounting by the rules of docs/design.md §4, independent of any serving engine.

The scheduler proposes a tentative decision per (request, item); only the step's outcome commits it.
"""
from __future__ import annotations

import enum
from collections import Counter, defaultdict
from dataclasses import dataclass, field, fields
from typing import Callable, NamedTuple

from mmscope import vocabulary
from mmscope.carry import counts
from mmscope.vocabulary import IN_STEP, Outcome


class Decision(enum.Enum):
    LOCAL_HIT = vocabulary.LOCAL  # embedding resident in the encoder cache
    DUPLICATE = vocabulary.IN_STEP  # the same item appears earlier in the same request this step
    CONNECTOR = vocabulary.CONNECTOR  # the EC connector holds it and will load it
    COMPUTE = "compute"  # the encoder will run for it
    DEFERRED = "deferred"  # no encoder budget or cache space this step
    # Cache space reserved with an EC connector present: the step's computed items are misses,
    # the others the connector loads (the scheduler reserves space for both alike).
    ALLOCATED = "allocated"


class Item(NamedTuple):
    """One multimodal input of one request; `key` is its content hash (the cache identifier).
    A NamedTuple: one is built per scheduled item, and a frozen dataclass costs 5x as much."""

    request_id: str
    index: int
    modality: str
    key: str
    embeds: int


@dataclass
class EncoderCacheStats:
    """Counts since the last drain, plus the cache's occupancy at the end of the last step."""

    # requests that committed an item or had one prefix-covered, once per step: the window unit
    # of the stats line's rates (vLLM's CachingMetrics drops an observation of no requests)
    requests: int = 0
    queries: int = 0
    hits: int = 0
    misses: int = 0
    deferrals: int = 0
    evictions: int = 0
    # items whose placeholders all lay in prefix-cache hits: the encoder was spared, not queried
    prefix_covered: int = 0
    hits_by_source: Counter = field(default_factory=Counter)
    queries_by_modality: Counter = field(default_factory=Counter)
    hits_by_modality: Counter = field(default_factory=Counter)
    prefix_covered_by_modality: Counter = field(default_factory=Counter)
    # The same in the unit the encoder's work and the cache's room are made of: an item's
    # embeddings (the rows of its encoder output), so a 4,000-embedding video weighs what it costs.
    query_embeds: int = 0
    hit_embeds: int = 0
    miss_embeds: int = 0  # what the encoder computed
    prefix_covered_embeds: int = 0
    hit_embeds_by_source: Counter = field(default_factory=Counter)
    query_embeds_by_modality: Counter = field(default_factory=Counter)
    hit_embeds_by_modality: Counter = field(default_factory=Counter)
    usage_embeds: int | None = None
    capacity_embeds: int | None = None

    @property
    def empty(self) -> bool:
        return not (self.queries or self.deferrals or self.evictions or self.prefix_covered)

    # The wire form (carry/counts.py): each count under its field's name, each tally of a
    # Counter under "<field>:<label>"; the occupancy only once the capacity is known.
    def to_wire(self) -> dict[str, int]:
        wire = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Counter):
                wire.update({counts.key(f.name, k): n for k, n in value.items()})
            elif f.name not in OCCUPANCY:
                wire[f.name] = value
        if self.capacity_embeds is not None:
            wire.update(usage_embeds=self.usage_embeds or 0, capacity_embeds=self.capacity_embeds)
        return wire

    @classmethod
    def from_wire(cls, wire: dict[str, int]) -> "EncoderCacheStats":
        stats = cls()
        for wire_key, n in wire.items():
            kind, labels = counts.split(wire_key)
            if labels:
                getattr(stats, kind)[labels[0]] += n
            elif hasattr(stats, kind):
                setattr(stats, kind, n)
        return stats


OCCUPANCY = ("usage_embeds", "capacity_embeds")  # gauges: carried over a drain, not added up


ProbeSink = Callable[[Outcome, Item, str | None], None]  # (outcome, item, hit source)


class EncoderCacheLedger:
    """Turns tentative per-item decisions into committed counts, once per (request, item)."""

    def __init__(self, probe: ProbeSink | None = None):
        self.probe = probe  # where committed decisions go: probe lines, the access log
        self._stats = EncoderCacheStats()
        # request id -> item index -> (item, decision): this step's tentative decisions. One dict
        # for the ledger's life: the scheduler's commit guard tests its truth in place.
        self._proposals: dict[str, dict[int, tuple[Item, Decision]]] = {}
        self._committed: dict[str, set[int]] = defaultdict(set)
        self._keys_allocated_this_step: set[str] = set()
        self._covered_this_step: set[str] = set()  # requests with an item prefix-covered
        self._drained_occupancy: tuple[int | None, int | None] = (None, None)
        # Items the EC connector loads in the step just committed (their requests' EC-load share)
        self.loaded: list[Item] = []

    # --- within a step ------------------------------------------------------------------------
    @property
    def proposals(self) -> dict:
        """This step's tentative decisions; truthy when a commit is due."""
        return self._proposals

    def propose(self, item: Item, decision: Decision) -> None:
        """A tentative decision for one item, replacing an earlier one for it in this step, except
        that nothing replaces DUPLICATE: the scheduler checks a duplicate against the cache once
        more when it reserves space for its first copy, and that check is no hit of its own."""
        looked = self._proposals.get(item.request_id)
        if looked is None:
            self._proposals[item.request_id] = {item.index: (item, decision)}
            return
        earlier = looked.get(item.index)
        if earlier is None or earlier[1] is not Decision.DUPLICATE:
            looked[item.index] = (item, decision)

    def allocated(self, key: str) -> None:
        """A scheduled request reserved cache space for `key` (computed or loaded) in this step."""
        self._keys_allocated_this_step.add(key)

    def forget(self, request_id: str) -> None:
        """The request's encoder entries were freed (finished or preempted): a resumed request
        commits its items again."""
        self._committed.pop(request_id, None)

    def prefix_covered(self, item: Item) -> None:
        """The request was scheduled with all of the item's placeholder tokens in prefix-cache
        hits: vLLM never looks the item up (docs/design.md §4 "prefix-covered"). Once per (request,
        item), like a query."""
        done = self._committed[item.request_id]
        if item.index in done:
            return
        done.add(item.index)
        self._covered_this_step.add(item.request_id)
        self._stats.prefix_covered += 1
        self._stats.prefix_covered_by_modality[item.modality] += 1
        self._stats.prefix_covered_embeds += item.embeds
        if self.probe:
            self.probe(Outcome.PREFIX_COVERED, item, None)

    def evicted(self, count: int) -> None:
        self._stats.evictions += count

    def occupancy(self, usage_embeds: int, capacity_embeds: int) -> None:
        self._stats.usage_embeds, self._stats.capacity_embeds = usage_embeds, capacity_embeds

    # --- end of a step ------------------------------------------------------------------------
    def commit_step(self, scheduled: set[str] | dict, computed: dict[str, list[int]]) -> None:
        """`scheduled`: the step's scheduled request ids; `computed`: items the encoder runs."""
        step_keys, self._keys_allocated_this_step = self._keys_allocated_this_step, set()
        sending, self._covered_this_step = self._covered_this_step, set()
        for request_id, looked in self._proposals.items():
            decisions = [looked[i] for i in sorted(looked)] if len(looked) > 1 else looked.values()
            if request_id in scheduled:
                if self._commit_request(request_id, decisions,
                                        set(computed.get(request_id, ())), step_keys):
                    sending.add(request_id)
            else:
                self._count_deferrals(decisions)
        self._proposals.clear()
        self._stats.requests += len(sending)

    def _commit_request(self, request_id, decisions, computed: set[int], step_keys) -> bool:
        """Whether the request committed an item."""
        done = self._committed[request_id]
        committed_any = False
        for item, decision in decisions:
            if decision is Decision.DEFERRED:
                self._defer(item)
            elif item.index in done:
                continue  # chunked prefill visits the item again: counted once
            elif decision is Decision.COMPUTE:
                # Reserved for the encoder: vLLM reserves exactly the step's computed items of a
                # scheduled request (scheduled_encoder_inputs), so this is a miss.
                self._count(item, None)
                done.add(item.index)
                committed_any = True
            elif decision is Decision.ALLOCATED:
                # Reserved with a connector: computed (a miss) or loaded (a connector hit)
                if item.index in computed:
                    self._count(item, None)
                else:
                    self._count(item, Decision.CONNECTOR.value)
                    self.loaded.append(item)
                done.add(item.index)
                committed_any = True
            else:
                # A resident hit on what another request of this step computes or loads: in_step.
                if decision is Decision.LOCAL_HIT and item.key in step_keys:
                    self._count(item, IN_STEP)
                else:
                    self._count(item, decision.value)
                done.add(item.index)
                committed_any = True
        return committed_any

    def take_loaded(self) -> list[Item]:
        loaded, self.loaded = self.loaded, []
        return loaded

    def _count(self, item: Item, source: str | None) -> None:
        s, embeds = self._stats, item.embeds
        s.queries += 1
        s.queries_by_modality[item.modality] += 1
        s.query_embeds += embeds
        s.query_embeds_by_modality[item.modality] += embeds
        if source is None:
            s.misses += 1
            s.miss_embeds += embeds
        else:
            s.hits += 1
            s.hits_by_source[source] += 1
            s.hits_by_modality[item.modality] += 1
            s.hit_embeds += embeds
            s.hit_embeds_by_source[source] += embeds
            s.hit_embeds_by_modality[item.modality] += embeds
        if self.probe:
            self.probe(Outcome.MISS if source is None else Outcome.HIT, item, source)

    def _defer(self, item: Item) -> None:
        self._stats.deferrals += 1
        if self.probe:
            self.probe(Outcome.DEFERRED, item, None)

    def _count_deferrals(self, decisions) -> None:
        for item, decision in decisions:
            if decision is Decision.DEFERRED:
                self._defer(item)

    @property
    def has_news(self) -> bool:
        """Something was counted, or the occupancy moved, since the last drain: most steps are
        decode steps, and for them this should be the only question asked."""
        s = self._stats
        return not s.empty or (s.usage_embeds, s.capacity_embeds) != self._drained_occupancy

    def drain(self) -> EncoderCacheStats:
        """Counts since the last drain; the occupancy gauges carry over."""
        stats = self._stats
        self._drained_occupancy = (stats.usage_embeds, stats.capacity_embeds)
        self._stats = EncoderCacheStats(usage_embeds=stats.usage_embeds,
                                        capacity_embeds=stats.capacity_embeds)
        return stats


def probe_line(outcome: Outcome, item: Item, source: str | None) -> str:
    """One grep-able line per committed input: ids, counts and a hash prefix, never content."""
    src = f" source={source}" if source else ""
    return (f"mm_cache_probe {outcome}{src} req={item.request_id} item={item.index} "
            f"modality={item.modality} hash={item.key[:16]} embeds={item.embeds}")
