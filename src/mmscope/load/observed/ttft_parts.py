"""A level's time to first token by part, for requests whose items hit and those that missed: from
the server's histograms (their deltas over the level) beside the client's own measure.

Means are exact (sum / count); medians and p90 are Prometheus' estimates from the buckets.
"""
from __future__ import annotations

import re
from collections import defaultdict

from mmscope import stages
from mmscope.expose.readout import histogram_quantile
from mmscope.load.observed import series

OUTCOMES = ("hit", "miss")
_KEY = re.compile(r"^(?P<name>\w+)_(?P<kind>bucket|sum|count)(?:\{(?P<labels>[^}]*)\})?$")


def _by_series(delta: dict[str, float], name: str) -> dict[tuple, dict]:
    """(outcome, part or None) -> {"sum", "count", "buckets": {le: cumulative count}}."""
    found: dict[tuple, dict] = defaultdict(lambda: {"sum": 0.0, "count": 0.0, "buckets": {}})
    for key, value in delta.items():
        m = _KEY.match(key)
        if m is None or m["name"] != name:
            continue
        labels = dict(kv.split("=", 1) for kv in m["labels"].split(",")) if m["labels"] else {}
        entry = found[(labels.get("encoder_cache"), labels.get("part"))]
        if m["kind"] == "bucket":
            entry["buckets"][float(labels["le"])] = value
        else:
            entry[m["kind"]] = value
    return found


def _summary(entry: dict | None) -> dict[str, float | None]:
    if not entry or entry["count"] <= 0:
        return {"mean_ms": None, "p50_ms": None, "p90_ms": None}
    ms = lambda v: None if v is None else round(v * 1000, 2)  # noqa: E731
    return {"mean_ms": ms(entry["sum"] / entry["count"]),
            "p50_ms": ms(histogram_quantile(0.5, entry["buckets"])),
            "p90_ms": ms(histogram_quantile(0.9, entry["buckets"]))}


def summary(delta: dict[str, float], name: str) -> dict[str, float | None]:
    """Mean, p50 and p90 ms of a histogram without labels of its own (vLLM's time to first
    token) over a level."""
    return _summary(_by_series(delta, name).get((None, None)))


def split(delta: dict[str, float], client_ttft_s: list[float]) -> dict:
    """Per outcome: requests, the server's TTFT and each part; and the mean time the client
    waited beyond the server's TTFT (transport, HTTP), over the level's multimodal requests."""
    totals, parts = _by_series(delta, series.TTFT_MM), _by_series(delta, series.TTFT_PARTS)
    out = {}
    for outcome in OUTCOMES:
        total = totals.get((outcome, None))
        out[outcome] = {"requests": int(round(total["count"])) if total else 0,
                        "ttft": _summary(total),
                        "parts": {p: _summary(parts.get((outcome, p))) for p in stages.TTFT_PARTS}}
    served = [totals[(o, None)] for o in OUTCOMES if (o, None) in totals]
    count = sum(e["count"] for e in served)
    beyond = None
    if count and client_ttft_s and round(count) == len(client_ttft_s):
        beyond = round((sum(client_ttft_s) - sum(e["sum"] for e in served)) / count * 1000, 2)
    out["client_beyond_server_mean_ms"] = beyond
    return out
