"""The encoder cache as vLLM's /metrics page shows it (a saved page or a live URL): counters, hit
rate, hits by source, and the time to first token by part of hits and misses (mean, p50, p90).

Read with the load verifier's own readers (`mmscope.load.series`, `mmscope.load.ttft_parts`).
"""
from __future__ import annotations

import os

from mmscope.errors import UserError


def read(source: str) -> dict:
    from mmscope.expose import readout
    from mmscope.load import series, ttft_parts

    text = fetch(source)
    try:
        values = readout.from_prometheus_text(text, histograms=series.HISTOGRAMS)
    except ValueError as e:
        raise UserError(f"{source}: not a Prometheus /metrics page ({e})") from None
    if series.QUERIES not in values:
        raise UserError(f"{source}: " + (series.counts_off(values) or (
            f"no {series.exposed(series.QUERIES)} series (a /metrics page of a vLLM server with "
            "mmscope's plugin is needed)")))
    queries, hits = values[series.QUERIES], values.get(series.HITS, 0.0)
    out = {"source": source,
           "counters": {k: _int(values.get(k)) for k in series.COUNTERS},
           "hits_by_source": {s: _int(values.get(series.by_source(s)))
                              for s in series.HIT_SOURCES},
           "hit_rate": round(hits / queries, 6) if queries else None,
           "capacity_embeds": _int(values.get(series.CAPACITY)),
           "usage_embeds": _int(values.get(series.USAGE)),
           "ttft": None}
    if series.ttft_requests(values):
        split = ttft_parts.split(values, [])
        out["ttft"] = {o: split[o] for o in ttft_parts.OUTCOMES}
    return out


def _int(value) -> int | None:
    return None if value is None else int(round(value))


def fetch(source: str) -> str:
    if source.startswith(("http://", "https://")):
        import httpx

        try:
            response = httpx.get(source, timeout=30)
            response.raise_for_status()
        except httpx.HTTPError as e:
            raise UserError(f"cannot read {source} ({e})") from None
        return response.text
    if not os.path.isfile(source):
        raise UserError(f"{source}: no such file")
    try:
        with open(source, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{source}: cannot read ({e})") from None
