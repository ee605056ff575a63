"""Running the sweep: a preflight (model, counters, embeddings per image), then per level the
planned requests at the given concurrency between two /metrics readings, and the level's numbers.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace

from mmscope.expose import readout
from mmscope.errors import UserError
from mmscope.load import epd, media_urls, series
from mmscope.load.client import Server, Timing
from mmscope.load.plan import PROBE_LEVEL, LevelPlan, PlannedRequest, Workload
from mmscope.load.verdict import Observed, Verdict, capacity_allows, judge

SETTLE_POLL_S = 0.2  # the last step's stats reach /metrics just after the last response
SETTLE_MAX_S = 5.0
PROBE_TEXT = "mmscope load probe: how many embeddings does one image take?"


@dataclass(frozen=True)
class Target:
    model: str
    embeds_per_image: int | None  # prompt tokens one image adds; None if usage is not reported


@dataclass(frozen=True)
class RequestResult:
    request: PlannedRequest
    timing: Timing
    source: str = media_urls.DATA_URL  # how its images were sent


@dataclass
class LevelResult:
    plan: LevelPlan
    results: list[RequestResult]
    wall_s: float
    delta: dict[str, float]
    capacity_embeds: int | None
    embeds_per_image: int | None
    fetches: media_urls.Fetches | None = None  # with --media http

    def count(self, key: str) -> int:
        return int(round(self.delta.get(key, 0.0)))

    @property
    def observed(self) -> Observed:
        return Observed(self.count(series.QUERIES), self.count(series.HITS),
                        self.count(series.EVICTIONS), self.capacity_embeds, self.embeds_per_image,
                        self.count(series.PREFIX_COVERED))

    @property
    def verdict(self) -> Verdict:
        verdict = epd.with_pd(judge(self.plan, self.observed), self.plan.images, self.delta)
        if self.fetches is None:
            return verdict
        return replace(verdict, text=f"{verdict.text}; {self.fetches.text()}")

    @property
    def capacity_allows(self) -> int | None:
        return capacity_allows(self.plan, self.observed)


async def preflight(server: Server, model: str | None, workload: Workload,
                    max_tokens: int) -> Target:
    """Fails early, with one line, on a wrong model, a server without mmscope's counters or one
    that refuses images; measures the embeddings of one image for the capacity estimate."""
    served = await server.models()
    if not served:
        raise UserError(f"{server.url} serves no model")
    if model is None:
        model = served[0]
    elif model not in served:
        raise UserError(f"model {model!r} is not served at {server.url} (it serves: "
                        f"{', '.join(served)})")
    values = await server.metrics()
    if series.QUERIES not in values:
        raise UserError(f"{server.url}/metrics: " + (series.counts_off(values) or (
            f"no {series.exposed(series.QUERIES)}: is mmscope installed in the server's Python "
            "environment (vLLM loads it as a plugin)?")))
    return Target(model, await _embeds_per_image(server, model, workload, max_tokens))


async def _embeds_per_image(server: Server, model: str, workload: Workload,
                            max_tokens: int) -> int | None:
    probe = workload.data_url(PROBE_LEVEL, 0)
    bare = await server.chat(model, PROBE_TEXT, [], max_tokens, "probe request without an image")
    one = await server.chat(model, PROBE_TEXT, [probe], max_tokens, "probe request with an image")
    workload.forget(PROBE_LEVEL)
    if bare.prompt_tokens is None or one.prompt_tokens is None:
        return None
    return max(one.prompt_tokens - bare.prompt_tokens, 0) or None


async def run_level(server: Server, target: Target, workload: Workload, plan: LevelPlan,
                    concurrency: int, max_tokens: int, urls: media_urls.Urls,
                    on_done=None) -> LevelResult:
    # Render first: image encoding must not count as the server's time to first token.
    sent = {r.index: urls.of(plan, r) for r in plan.requests}
    media_server = urls.server
    served = media_server.counts() if media_server else (0, 0)
    before = await server.metrics()
    start = time.perf_counter()
    results = await _send_all(server, target.model, workload, plan, concurrency, max_tokens,
                              sent, urls.options, on_done)
    wall = time.perf_counter() - start
    after = await _settled_metrics(server, before, plan.images, len(plan.requests))
    delta = readout.delta(before, after)
    fetches = None
    if media_server:
        now = media_server.counts()
        fetches = media_urls.fetches(delta, urls.planned(plan), (now[0] - served[0], now[1] - served[1]))
    workload.forget(plan.level)
    urls.forget(plan.level)
    capacity = int(after.get(series.CAPACITY, 0)) or None
    return LevelResult(plan, results, wall, delta, capacity, target.embeds_per_image, fetches)


async def _send_all(server, model, workload, plan, concurrency, max_tokens, sent, options,
                    on_done):
    pending = iter(plan.requests)  # shared by the workers, so requests leave in plan order
    results: list[RequestResult] = []
    answered = {r.index: asyncio.Event() for r in plan.requests}
    first_shown = _first_shown(plan)

    async def worker():
        for request in pending:
            # A repeat waits for the answer to the request that first showed its image: sent
            # together, the server could encode the repeat first and the plan's hit would land
            # on the other request.
            for image, repeat in zip(request.images, request.repeats):
                if repeat:
                    await answered[first_shown[image]].wait()
            what = f"request {request.index} of reuse level {plan.reuse:g}"
            try:
                timing = await server.chat(model, request.text, sent[request.index], max_tokens,
                                           what, images_first=workload.prefix)
            finally:
                answered[request.index].set()
            results.append(RequestResult(request, timing, options.source(request)))
            if on_done:
                on_done()

    tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
    return sorted(results, key=lambda r: r.request.index)


def _first_shown(plan: LevelPlan) -> dict[int, int]:
    """Per image, the request that sends it first."""
    shown: dict[int, int] = {}
    for request in plan.requests:
        for image, repeat in zip(request.images, request.repeats):
            if not repeat:
                shown.setdefault(image, request.index)
    return shown


async def _settled_metrics(server: Server, before: dict, expected_queries: int,
                           expected_requests: int) -> dict:
    """Counters once they stop moving and every planned query (and, where the server splits
    the time to first token, every request's split) has arrived."""
    deadline = time.monotonic() + SETTLE_MAX_S
    last = await server.metrics()
    while time.monotonic() < deadline:
        await asyncio.sleep(SETTLE_POLL_S)
        now = await server.metrics()
        # every item is either looked up or spared by the prefix cache
        arrived = sum(now.get(k, 0) - before.get(k, 0)
                      for k in (series.QUERIES, series.PREFIX_COVERED)) >= expected_queries
        if series.ttft_requests(before) is not None:
            arrived &= series.ttft_requests(now) - series.ttft_requests(before) >= expected_requests
        if _counters(now) == _counters(last) and arrived:
            return now
        last = now
    return last


def _counters(values: dict[str, float]) -> tuple[float, ...]:
    return tuple(values.get(k, 0.0) for k in series.COUNTERS)
