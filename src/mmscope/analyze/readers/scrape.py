"""The encoder cache as vLLM's /metrics page shows it (a saved page or a live URL): counters, hit
rate, hits by source, where items were served from and what each cache layer saved, and the time
to first token by part of hits and misses (mean, p50, p90).

Read with the load verifier's own readers (`mmscope.load.observed.series`, `mmscope.load.observed.ttft_parts`).
"""
from __future__ import annotations

import os
import re

from mmscope.errors import UserError


DEFAULT_TIMEOUT_S = 10.0  # a /metrics page answers in milliseconds; a hung server gets this long
_URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def read(source: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict:
    from mmscope.expose import layers, readout
    from mmscope.load.observed import series, ttft_parts

    text = fetch(source, timeout_s)
    try:
        values = readout.from_prometheus_text(text, histograms=series.HISTOGRAMS)
    except ValueError as e:
        raise UserError(f"{source}: not a Prometheus /metrics page ({printable(str(e))})") \
            from None
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
           "layers": layers.read(values),
           "ttft": None}
    if series.ttft_requests(values):
        split = ttft_parts.split(values, [])
        out["ttft"] = {o: split[o] for o in ttft_parts.OUTCOMES}
    return out


def seconds(at_most: float):
    """An argparse type: seconds above 0 and at most `at_most` (every command's timeouts)."""
    import argparse
    import math

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
        if not (math.isfinite(value) and value <= at_most):
            raise argparse.ArgumentTypeError(f"must be at most {at_most:g} s: {text!r}")
        return value
    return parse


timeout = seconds(86400.0)  # --timeout of analyze --metrics and doctor --url: at most a day


def _int(value) -> int | None:
    return None if value is None else int(round(value))


def fetch(source: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """A /metrics page's text from a URL (http or https) or a saved file; what is not text
    is said, never echoed."""
    if source.startswith(("http://", "https://")):
        text = _get(source, timeout_s)
    elif _URL_SCHEME.match(source):
        raise UserError(f"{source}: only http:// and https:// URLs (or a saved file) are read")
    elif os.path.isdir(source):
        raise UserError(f"{source}: is a directory, not a /metrics page")
    elif not os.path.isfile(source):
        raise UserError(f"{source}: no such file")
    else:
        try:
            with open(source, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            raise UserError(f"{source}: not a Prometheus /metrics page (not UTF-8 text)") \
                from None
        except OSError as e:
            raise UserError(f"{source}: cannot read ({e.strerror})") from None
    if _binary(text):
        raise UserError(f"{source}: not a Prometheus /metrics page ({len(text)} characters of "
                        "binary data)")
    return text


def _get(url: str, timeout_s: float) -> str:
    import httpx

    try:
        response = httpx.get(url, timeout=timeout_s)
        response.raise_for_status()
    except httpx.TimeoutException:
        raise UserError(f"cannot read {url}: no answer within {timeout_s:g} s "
                        "(--timeout)") from None
    except httpx.HTTPError as e:
        raise UserError(f"cannot read {url} ({printable(str(e))})") from None
    return response.text


def _binary(text: str) -> bool:
    """Control characters other than line ends and tabs: no Prometheus text page has them."""
    return any(c < " " and c not in "\n\r\t" or c in "\x7f\ufffd" for c in text[:4096])


def printable(text: str, limit: int = 120) -> str:
    """A message as one printable line: control characters as `?`, at most `limit` of them."""
    first = (text.splitlines() or [""])[0]
    clean = "".join(c if c.isprintable() else "?" for c in first)
    return clean if len(clean) <= limit else clean[:limit - 1] + "…"
