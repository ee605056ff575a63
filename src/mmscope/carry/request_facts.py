"""Each multimodal request's items and encoder-cache outcomes until its first token, tallied in
EngineCore from the ledger's committed decisions for vLLM's request span (docs/design.md §5a).

Independent of vLLM. Keys are the tails of the span's attribute names (expose/otlp.py)."""
from __future__ import annotations

from collections import Counter
from typing import Iterable

from mmscope.carry.ledger import Item
from mmscope.vocabulary import HIT_SOURCES, Outcome

ITEMS = "items."  # + modality: the request's items of that modality
MISSES = "encoder_cache.misses"
HITS = "encoder_cache.hits."  # + source (local, in_step, connector)
PREFIX_COVERED = "encoder_cache.prefix_covered"
DEFERRALS = "encoder_cache.deferrals"
COMPUTED_EMBEDS = "embeddings.computed"  # embeddings the encoder computed for it (its misses)
SPARED_EMBEDS = "embeddings.spared"  # embeddings it did not compute: hits and prefix-covered
COUNTS = (MISSES, *(HITS + s for s in HIT_SOURCES), PREFIX_COVERED, DEFERRALS, COMPUTED_EMBEDS,
          SPARED_EMBEDS)


def zeros() -> dict[str, int]:
    """Every count a record carries, so that a backend can query `= 0` as well as `> 0`."""
    return dict.fromkeys(COUNTS, 0)


def items(modalities: Iterable[str]) -> dict[str, int]:
    return {ITEMS + m: n for m, n in Counter(modalities).items()}


def tally(record: dict[str, int], outcome: Outcome, item: Item, source: str | None) -> None:
    """One committed decision of the ledger (its probe sink's outcome names) into the record."""
    if outcome == Outcome.HIT:
        record[HITS + source] += 1
        record[SPARED_EMBEDS] += item.embeds
    elif outcome == Outcome.MISS:
        record[MISSES] += 1
        record[COMPUTED_EMBEDS] += item.embeds
    elif outcome == Outcome.PREFIX_COVERED:
        record[PREFIX_COVERED] += 1
        record[SPARED_EMBEDS] += item.embeds
    elif outcome == Outcome.DEFERRED:
        record[DEFERRALS] += 1
