"""A level's items by the cache layer that served them, planned against observed
(`vllm:mm_items_total`), and the work each layer saved (`vllm:mm_work_saved_seconds_total`).

The plan knows its repeats: with vLLM's processor cache on, a repeat hits it first (its 4 GiB
outlast the encoder cache), then the encoder cache, the prefix cache or the EC connector spares its
encoder run; each distinct image is a processor miss and computed once.
"""
from __future__ import annotations

from dataclasses import replace

from mmscope.expose import layers
from mmscope.load.plan import LevelPlan
from mmscope.load.verdict import Verdict
from mmscope.vocabulary import EncoderWay, ProcessorWay

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


def cells(side: dict) -> list[str]:
    """A level's row of the layers table: observed (planned) where the plan says."""
    plan, seen = side["planned"], side["observed"]
    processor = [f"{seen['processor'][w]} ({plan['processor'][w]})" for w in
                 (ProcessorWay.HIT, ProcessorWay.MISS, ProcessorWay.OFF)]
    encoder = [str(seen["encoder"][w]) for w in SPARED]
    saved = sum(seen["saved_s"].values())
    return [*processor, *encoder, f"{seen['spared']} ({plan['spared']})",
            f"{seen['encoder'][EncoderWay.COMPUTED]} ({plan['computed']})", f"{saved:.3f}"]


COLUMNS = ("processor hit", "processor miss", "processor off",
           *(layers.SERVED_BY[w] for w in SPARED), "spared", "computed", "work saved s")
