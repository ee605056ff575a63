"""Whether a level's observed encoder-cache hits agree with its plan, and if not, whether the
cache's capacity explains the difference; and what each cache layer did against the plan.

The cache-size model (vLLM's eviction rule), fed the plan in order, estimates the hits capacity
allows; the evictions counter bounds what capacity can explain (each lost hit needs an eviction).
Where a router spread the requests, repeats that reached instances without their image explain
the rest, down to the fewest hits any router gives. Per layer (`vllm:mm_items_total`), the plan
knows its repeats: with vLLM's processor cache on, a repeat hits it first (its 4 GiB outlast the
encoder cache), then the encoder cache, the prefix cache or the EC connector spares its encoder
run; each distinct image is a processor miss and computed once.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from mmscope.cache_size import model
from mmscope.cache_size.trace import FREE, MISS
from mmscope.expose import layers
from mmscope.load.fleet import Bounds
from mmscope.load.plan import LevelPlan
from mmscope.vocabulary import EncoderWay, ProcessorWay

MATCH, EXPLAINED, ROUTED, UNEXPLAINED, EXCESS = ("match", "explained", "routed", "unexplained",
                                                 "excess")


@dataclass(frozen=True)
class Observed:
    queries: int
    hits: int
    evictions: int
    capacity_embeds: int | None  # None: the server did not say
    embeds_per_image: int | None  # None: could not be measured
    prefix_covered: int = 0  # items the prefix cache spared: encoder work avoided, not queried

    @property
    def avoided(self) -> int:
        return self.hits + self.prefix_covered


@dataclass(frozen=True)
class Verdict:
    status: str
    text: str

    @property
    def ok(self) -> bool:
        return self.status != UNEXPLAINED


def lru_hits(plan: LevelPlan, capacity_embeds: int, embeds_per_image: int) -> int:
    """Hits of vLLM's eviction rule on the plan sent one request at a time: the same one-pass
    model as `mmscope cache-size` (entries in use are kept, freed ones stay resident until space
    is needed, the one freed longest ago goes first), references held until the request ends."""
    if embeds_per_image <= 0:
        return plan.planned_hits
    events = []
    for r, request in enumerate(plan.requests):
        events += [(r, image, embeds_per_image, MISS) for image in request.images]
        events.append((r, FREE, 0, 0))
    reach = model.distances(events, release="end")
    return int(((reach > 0) & (reach <= capacity_embeds)).sum())


def judge(plan: LevelPlan, seen: Observed, allows: int | None = None,
          routed: Bounds | None = None) -> Verdict:
    """Repeats spared the encoder by a hit or by the prefix cache, against the plan's repeats.
    `allows`: the hits an LRU of the capacity gives the plan; `routed`: the bounds of the router
    that spread the requests, where the client did not."""
    planned = plan.planned_hits
    shortfall = planned - seen.avoided
    spared = f" ({seen.hits} hits, {seen.prefix_covered} prefix-covered)" if seen.prefix_covered \
        else ""
    share = f"{seen.avoided} of {planned} planned hits{spared}"
    if shortfall == 0:
        status, text = MATCH, f"hits match the plan ({seen.avoided} of {planned}){spared}"
    elif shortfall < 0:
        status, text = EXCESS, (f"{-shortfall} hits more than planned: other traffic on the "
                                "server, or images still cached from an earlier run with the same "
                                "--seed")
    elif shortfall <= seen.evictions:
        status, text = EXPLAINED, (f"{share}; shortfall explained by capacity "
                                   f"({_capacity(seen, allows)})")
    elif routed is not None and seen.avoided + seen.evictions >= routed.fewest:
        status, text = ROUTED, (f"{share}; shortfall explained by the router: repeats reached "
                                "instances that had not seen their image")
    else:
        unexplained = shortfall - seen.evictions
        status, text = UNEXPLAINED, (f"{share}; {unexplained} hits missing that capacity does not "
                                     f"explain ({_capacity(seen, allows)})")
    fleet = f"; {routed.text()}" if routed is not None else ""
    return Verdict(status, text + fleet + _queries_note(plan, seen))


def _capacity(seen: Observed, allows: int | None) -> str:
    size = f"capacity {seen.capacity_embeds} embeds" if seen.capacity_embeds else "capacity unknown"
    lru = f"; an LRU of that size allows {allows} hits" if allows is not None else ""
    return f"{seen.evictions} evictions, {size}{lru}"


def _queries_note(plan: LevelPlan, seen: Observed) -> str:
    expected = plan.images - seen.prefix_covered  # a prefix-covered item is never looked up
    if seen.queries == expected:
        return ""
    if seen.queries > expected:
        why = "requests preempted and resumed, or other traffic"
    else:
        why = "lookups skipped: a prefix-cache hit may cover images"
    return f"; {seen.queries} queries for {expected} images ({why})"


# --- each cache layer against the plan ------------------------------------------------------
SPARED = (EncoderWay.CACHE_HIT, EncoderWay.PREFIX_COVERED, EncoderWay.EC_LOADED)


def observed(delta: dict[str, float], prefix: str = "") -> dict | None:
    """The level's items by way and the seconds saved, of the series under `prefix` (an EPD
    pair's PD instance: `pd:`); None where the server has no such series."""
    return layers.read({k[len(prefix):]: v for k, v in delta.items() if k.startswith(prefix)})


def planned(plan: LevelPlan, processor_cache: bool) -> dict:
    """What the plan gives each layer: the repeats hit the processor cache (where it is on) and
    are spared the encoder by one of its caches; the distinct images miss and are computed."""
    repeats, distinct = plan.planned_hits, plan.distinct
    processor = ({ProcessorWay.HIT: repeats, ProcessorWay.MISS: distinct, ProcessorWay.OFF: 0}
                 if processor_cache else
                 {ProcessorWay.HIT: 0, ProcessorWay.MISS: 0, ProcessorWay.OFF: plan.images})
    return {"processor": {str(k): v for k, v in processor.items()},
            "spared": repeats, "computed": distinct}


def compared(plan: LevelPlan, seen: dict) -> dict:
    """The plan and what the server counted, side by side. The processor cache is on where the
    server looked any item up."""
    on = seen["processor"][ProcessorWay.OFF] < seen["items"] or not seen["items"]
    return {"planned": planned(plan, on), "observed": {
        **seen, "spared": sum(seen["encoder"][w] for w in SPARED)}}


def note(side: dict) -> str | None:
    """What of the plan a layer did not do, or None where every layer did its part."""
    plan, seen = side["planned"], side["observed"]
    notes = []
    hits, planned_hits = seen["processor"][ProcessorWay.HIT], plan["processor"][ProcessorWay.HIT]
    if hits < planned_hits:
        notes.append(f"processor cache {hits} of {planned_hits} planned hits (repeats it no "
                     "longer held: --mm-processor-cache-gb)")
    if seen["encoder"][EncoderWay.COMPUTED] > plan["computed"]:
        notes.append(f"the encoder computed {seen['encoder'][EncoderWay.COMPUTED]} items for "
                     f"{plan['computed']} distinct images")
    return "; ".join(notes) or None


def with_layers(verdict: Verdict, plan: LevelPlan, delta: dict[str, float]) -> Verdict:
    """The verdict, with what the cache layers did against the plan where they differ."""
    seen = observed(delta)
    if seen is None:
        return verdict
    said = note(compared(plan, seen))
    return verdict if said is None else replace(verdict, text=f"{verdict.text}; layers: {said}")
