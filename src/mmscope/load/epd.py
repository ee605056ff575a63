"""`mmscope load --encoder-url E --url PD`: the sweep through an encoder instance and a prefill/decode
instance, each request routed as vLLM's disaggregated-encoder proxy routes it (docs/load.md).

Per image, one request to the encoder instance with the text removed and max_tokens 1; then the
original request to the PD instance. The producer's counters are judged like a single server's;
on the PD instance every query must be a hit (loaded by the EC connector, or still resident).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from mmscope.errors import UserError
from mmscope.load.observed import series
from mmscope.load.client import Server, Timing, Url, chat_body
from mmscope.load.verdict import UNEXPLAINED, Verdict

PD = "pd:"  # the PD instance's series in a pair's readings, beside the encoder instance's
PRIMER_MAX_TOKENS = 1


def primers(model: str, image_urls: list[Url]) -> list[bytes]:
    """One request per image: that image alone, no text, one token; what the encoder instance
    needs to compute and publish the item. (vLLM's proxy does not stream it; here it streams like
    the original, which changes nothing the encoder does.)"""
    return [chat_body(model, None, [url], PRIMER_MAX_TOKENS) for url in image_urls]


class PairServer(Server):
    """The PD instance as `Server` sees it (models, chat), the encoder instance primed before each
    chat. metrics() is the encoder instance's reading, except the time-to-first-token splits,
    which are the PD instance's (the request the user waits for runs there), plus the PD
    instance's whole reading under `pd:`."""

    def __init__(self, encoder_url: str, pd_url: str, http, request_timeout_s: float):
        super().__init__(pd_url, http, request_timeout_s)
        self.encoder = Server(encoder_url, http, request_timeout_s, "--encoder-url")
        self.pd_url = self.base
        self.url = f"{self.encoder.url} -> {self.pd_url}"

    async def metrics(self) -> dict[str, float]:
        encoder, pd = await asyncio.gather(self.encoder.metrics(), super().metrics())
        if series.QUERIES not in pd:
            raise UserError(f"{self.pd_url}/metrics has no {series.exposed(series.QUERIES)}: is "
                            "mmscope installed in the PD instance's Python environment?")
        reading = {k: v for k, v in encoder.items() if not k.startswith(series.HISTOGRAMS)}
        reading.update((k, v) for k, v in pd.items() if k.startswith(series.HISTOGRAMS))
        reading.update((PD + k, v) for k, v in pd.items())
        return reading

    async def chat(self, model: str, text: str, image_urls: list[Url], max_tokens: int,
                   what: str, images_first: bool = False) -> Timing:
        """The pair's time to first token: from the first primer to the PD instance's token."""
        start = time.perf_counter()
        await asyncio.gather(*(self.encoder.send(p, f"{what}, encoder request")
                               for p in primers(model, image_urls)))
        primed = time.perf_counter() - start
        timing = await super().chat(model, text, image_urls, max_tokens, what, images_first)
        return replace(timing, ttft_s=timing.ttft_s + primed, e2e_s=timing.e2e_s + primed)


def pd_counts(delta: dict[str, float]) -> dict[str, int] | None:
    """The PD instance's queries, misses and hits by source in a level, or None for one server."""
    if PD + series.QUERIES not in delta:
        return None
    keys = {"queries": series.QUERIES, "misses": series.MISSES,
            "prefix_covered": series.PREFIX_COVERED,
            **{s: series.by_source(s) for s in series.HIT_SOURCES}}
    return {name: int(round(delta.get(PD + key, 0.0))) for name, key in keys.items()}


def with_pd(verdict: Verdict, images: int, delta: dict[str, float]) -> Verdict:
    """A pair's verdict: the encoder instance's, unless the PD instance missed (its encoder ran)
    or looked up another number of items than were sent (less those its prefix cache spared)."""
    pd = pd_counts(delta)
    if pd is None:
        return verdict
    hits = ", ".join(f"{pd[s]} {s}" for s in series.HIT_SOURCES if pd[s])
    if pd["misses"] or pd["queries"] + pd["prefix_covered"] != images:
        return Verdict(UNEXPLAINED, f"{verdict.text}; PD instance: {pd['misses']} misses and "
                                    f"{pd['queries']} queries for {images} images (its encoder "
                                    "ran: the connector did not hold them)")
    return replace(verdict, text=f"{verdict.text}; PD instance: all {images} queries hits "
                                 f"({hits or 'none'})")
