"""Where items were served from, read back from /metrics (`vllm:mm_items_total`,
`vllm:mm_work_saved_seconds_total`): items by each layer and the work each layer saved, and the
lines that say them in `analyze --metrics`, `load` and the demo (docs/design.md §4b).
"""
from __future__ import annotations

import re

from mmscope.expose import metrics
from mmscope.expose.readout import series_key
from mmscope.vocabulary import EncoderWay, Layer, ProcessorWay

ITEMS = series_key(metrics.ITEMS[0], {})
SAVED = series_key(metrics.WORK_SAVED[0], {})
_LABELS = re.compile(r"(\w+)=([^,}]*)")
# How the lines name each way: the layer that served the item, or the encoder
SERVED_BY = {EncoderWay.CACHE_HIT: "encoder cache", EncoderWay.PREFIX_COVERED: "prefix cache",
             EncoderWay.EC_LOADED: "EC connector", EncoderWay.COMPUTED: "encoder"}
LAYER_NAMES = {Layer.PROCESSOR_CACHE: "processor cache", Layer.PREFIX_CACHE: "prefix cache",
               Layer.ENCODER_CACHE: "encoder cache", Layer.EC_CONNECTOR: "EC connector"}


def read(values: dict[str, float]) -> dict | None:
    """From a readout (`readout.from_prometheus_text` or its delta): items by encoder way and by
    processor way, and seconds saved by layer; None where the page has no such series."""
    encoder = dict.fromkeys(map(str, EncoderWay), 0)
    processor = dict.fromkeys(map(str, ProcessorWay), 0)
    saved = dict.fromkeys(map(str, Layer), 0.0)
    found = False
    for key, value in values.items():
        name, _, labels = key.partition("{")
        if name == ITEMS:
            found = True
            got = dict(_LABELS.findall(labels))
            encoder[got["encoder"]] = encoder.get(got["encoder"], 0) + round(value)
            processor[got["processor"]] = processor.get(got["processor"], 0) + round(value)
        elif name == SAVED:
            saved[dict(_LABELS.findall(labels))["layer"]] += value
    if not found:
        return None
    return {"items": sum(encoder.values()), "encoder": encoder, "processor": processor,
            "saved_s": {k: round(v, 6) for k, v in saved.items()}}


def rows(ways: dict) -> list[tuple[str, int, float | None]]:
    """(layer, items it served, seconds it saved) of each layer, then the encoder (no saving)."""
    served = [(LAYER_NAMES[Layer.PROCESSOR_CACHE], ways["processor"][ProcessorWay.HIT],
               Layer.PROCESSOR_CACHE)]
    served += [(SERVED_BY[way], ways["encoder"][way], layer)
               for way, layer in ((EncoderWay.PREFIX_COVERED, Layer.PREFIX_CACHE),
                                  (EncoderWay.CACHE_HIT, Layer.ENCODER_CACHE),
                                  (EncoderWay.EC_LOADED, Layer.EC_CONNECTOR))]
    return [(name, n, ways["saved_s"][layer]) for name, n, layer in served] + [
        (f"{SERVED_BY[EncoderWay.COMPUTED]} (computed)", ways["encoder"][EncoderWay.COMPUTED],
         None)]


def lines(ways: dict) -> list[str]:
    """Two lines: the items by the layer that served their embeddings and by the processor
    cache's answer, then the seconds each layer saved."""
    encoder = ", ".join(f"{SERVED_BY[w]} {n}" for w, n in ways["encoder"].items() if n)
    processor = ", ".join(f"{w} {n}" for w, n in ways["processor"].items() if n)
    saved = ways["saved_s"]
    total = sum(saved.values())
    by_layer = ", ".join(f"{LAYER_NAMES[k]} {v:.3f} s" for k, v in saved.items() if v)
    return [f"items served from: {encoder or 'none'} ({ways['items']} items; processor cache "
            f"{processor or 'none'})",
            f"work saved: {total:.3f} s" + (f" ({by_layer})" if by_layer else "")]
