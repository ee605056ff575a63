"""Running the sweep: a preflight (model, counters, embeddings per image), then per level the
planned requests at the given concurrency, each to its instance, between two readings of the
counters, and the level's numbers.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from functools import cached_property

from mmscope.errors import UserError
from mmscope.load import epd, media_urls
from mmscope.load.observed import readings, series
from mmscope.load.client import Server, Timing
from mmscope.load.fleet import Bounds, Shard, bounds
from mmscope.load.plan import PROBE_LEVEL, LevelPlan, PlannedRequest, Workload
from mmscope.load.observed.readings import Pages, Reading
from mmscope.load.verdict import Observed, Verdict, judge, lru_hits, with_layers

PROBE_TEXT = "mmscope load probe: how many embeddings does one image take?"


@dataclass(frozen=True)
class Target:
    model: str
    embeds_per_image: int | None  # prompt tokens one image adds; None if usage is not reported


@dataclass(frozen=True)
class Fleet:
    """Where this process sends its part of the plan, and where it reads the counters."""

    servers: list[Server]
    counters: object  # readings.Pages of the servers, or prometheus.Prometheus
    shard: Shard = field(default_factory=lambda: Shard(0))

    def server(self, request: PlannedRequest) -> Server:
        return self.servers[self.shard.instance(request, len(self.servers))]

    def spread(self, plan: LevelPlan) -> dict[str, LevelPlan] | None:
        """Each instance's requests, where the readings are the servers' own; None where a
        router between them and the instances spread the requests."""
        if not isinstance(self.counters, Pages):
            return None
        return {server.url: part for server, part in
                zip(self.servers, self.shard.spread(plan, len(self.servers)))}


@dataclass(frozen=True)
class RequestResult:
    request: PlannedRequest
    timing: Timing
    source: str = media_urls.DATA_URL  # how its images were sent


@dataclass
class LevelResult:
    plan: LevelPlan  # this process's part of the level
    results: list[RequestResult]
    wall_s: float
    deltas: Reading  # each instance's series over the level
    capacities: dict[str, int | None]  # each instance's encoder cache, in embeddings
    embeds_per_image: int | None
    fetches: media_urls.Fetches | None = None  # with --media http
    spread: dict[str, LevelPlan] | None = None  # each instance's requests, where known
    build_s: float = 0.0  # rendering the level's images before its first request

    @cached_property
    def delta(self) -> dict[str, float]:
        return readings.total(self.deltas)

    def count(self, key: str) -> int:
        return int(round(self.delta.get(key, 0.0)))

    @property
    def capacity_embeds(self) -> int | None:
        capacities = list(self.capacities.values())
        return sum(capacities) if capacities and all(capacities) else None

    @property
    def observed(self) -> Observed:
        return Observed(self.count(series.QUERIES), self.count(series.HITS),
                        self.count(series.EVICTIONS), self.capacity_embeds, self.embeds_per_image,
                        self.count(series.PREFIX_COVERED))

    @property
    def routed(self) -> Bounds | None:
        """The router's bounds, where one spread the requests over several instances."""
        if self.spread is not None or len(self.deltas) < 2:
            return None
        return bounds(self.plan, len(self.deltas))

    @cached_property
    def verdict(self) -> Verdict:
        verdict = epd.with_pd(judge(self.plan, self.observed, self.capacity_allows, self.routed),
                              self.plan.images, self.delta)
        verdict = with_layers(verdict, self.plan, self.delta)
        if self.fetches is None:
            return verdict
        return replace(verdict, text=f"{verdict.text}; {self.fetches.text()}")

    @cached_property
    def capacity_allows(self) -> int | None:
        """Hits of an LRU of each instance's capacity on the requests it was sent."""
        spread = self.spread
        if spread is None and len(self.deltas) == 1:
            spread = {instance: self.plan for instance in self.deltas}
        if spread is None or not self.embeds_per_image:
            return None
        capacities = [self.capacities.get(instance) for instance in spread]
        if not all(capacities):
            return None
        return sum(lru_hits(part, capacity, self.embeds_per_image)
                   for part, capacity in zip(spread.values(), capacities))


async def preflight(fleet: Fleet, model: str | None, workload: Workload,
                    max_tokens: int) -> Target:
    """Fails early, with one line, on a wrong model, a server without mmscope's counters or one
    that refuses images; measures the embeddings of one image for the capacity estimate."""
    lists = await asyncio.gather(*(server.models() for server in fleet.servers))
    for server, served in zip(fleet.servers, lists):
        if not served:
            raise UserError(f"{server.url} serves no model")
    model = model if model is not None else lists[0][0]
    for server, served in zip(fleet.servers, lists):
        if model not in served:
            raise UserError(f"model {model!r} is not served at {server.url} (it serves: "
                            f"{', '.join(served)})")
    for instance, values in (await fleet.counters.read()).items():
        if series.QUERIES not in values:
            raise UserError(f"{instance}/metrics: " + (series.counts_off(values) or (
                f"no {series.exposed(series.QUERIES)}: is mmscope installed in the server's "
                "Python environment (vLLM loads it as a plugin)?")))
    return Target(model, await _embeds_per_image(fleet.servers[0], model, workload, max_tokens))


async def _embeds_per_image(server: Server, model: str, workload: Workload,
                            max_tokens: int) -> int | None:
    probe = workload.data_url(PROBE_LEVEL, 0)
    bare = await server.chat(model, PROBE_TEXT, [], max_tokens, "probe request without an image")
    one = await server.chat(model, PROBE_TEXT, [probe], max_tokens, "probe request with an image")
    workload.forget(PROBE_LEVEL)
    if bare.prompt_tokens is None or one.prompt_tokens is None:
        return None
    return max(one.prompt_tokens - bare.prompt_tokens, 0) or None


async def run_level(fleet: Fleet, target: Target, workload: Workload, plan: LevelPlan,
                    concurrency: int, max_tokens: int, urls: media_urls.Urls,
                    on_done=None) -> LevelResult:
    # Render first: image encoding must not count as the server's time to first token.
    built = time.perf_counter()
    sent = {r.index: urls.of(plan, r) for r in plan.requests}
    build_s = time.perf_counter() - built
    media_server = urls.server
    served = media_server.counts() if media_server else (0, 0)
    before = await fleet.counters.read()
    start = time.perf_counter()
    results = await _send_all(fleet, target.model, workload, plan, concurrency, max_tokens,
                              sent, urls.options, on_done)
    wall = time.perf_counter() - start
    after = await _settled(fleet.counters, before, plan.images, len(plan.requests))
    deltas = readings.deltas(before, after)
    fetches = None
    if media_server:
        now = media_server.counts()
        fetches = media_urls.fetches(readings.total(deltas), urls.planned(plan),
                                     (now[0] - served[0], now[1] - served[1]))
    workload.forget(plan.level)
    urls.forget(plan.level)
    capacities = {instance: int(values.get(series.CAPACITY, 0)) or None
                  for instance, values in after.items()}
    return LevelResult(plan, results, wall, deltas, capacities, target.embeds_per_image, fetches,
                       fleet.spread(plan), build_s)


async def _send_all(fleet, model, workload, plan, concurrency, max_tokens, sent, options,
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
                timing = await fleet.server(request).chat(
                    model, request.text, sent[request.index], max_tokens, what,
                    images_first=workload.prefix)
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


async def _settled(counters, before: Reading, expected_queries: int,
                   expected_requests: int) -> Reading:
    """Readings once they stop moving and every planned query (and, where the servers split
    the time to first token, every request's split) has arrived."""
    deadline = time.monotonic() + counters.settle_s
    start = readings.total(before)
    last = await counters.read()
    while time.monotonic() < deadline:
        await asyncio.sleep(counters.poll_s)
        now = await counters.read()
        total = readings.total(now)
        # every item is either looked up or spared by the prefix cache
        arrived = sum(total.get(k, 0) - start.get(k, 0)
                      for k in (series.QUERIES, series.PREFIX_COVERED)) >= expected_queries
        if series.ttft_requests(start) is not None:
            arrived &= series.ttft_requests(total) - series.ttft_requests(start) \
                >= expected_requests
        if _counters(now) == _counters(last) and arrived:
            return now
        last = now
    return last


def _counters(reading: Reading) -> dict[str, tuple[float, ...]]:
    return {instance: tuple(values.get(k, 0.0) for k in series.COUNTERS)
            for instance, values in reading.items()}
