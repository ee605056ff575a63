"""The fleet's counters from the Prometheus that scrapes it (`--prometheus URL`), for when only a
router's address is reachable: a reading holds each instance's series as scraped after it began.

`--prometheus-match '{job="vllm"}'` picks the fleet's series; the labels Prometheus adds to a
target's series (job, instance, any relabelled ones) are set aside, `instance` naming the instance.
"""
from __future__ import annotations

import asyncio
import json
import re
from collections import defaultdict

import aiohttp

from mmscope.errors import UserError
from mmscope.expose import readout
from mmscope.load.observed import series
from mmscope.load.client import base_url, one_line
from mmscope.load.observed.readings import Reading

QUERY_PATH = "/api/v1/query"
TARGETS_PATH = "/api/v1/targets"
INSTANCE = "instance"
POLL_S = 0.25
FRESH_SCRAPES = 3  # a reading waits this many scrape intervals (and FRESH_SLACK_S) for its scrape
FRESH_SLACK_S = 10.0
DEFAULT_INTERVAL_S = 60.0  # Prometheus' own default, for targets that do not say
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def matcher(text: str) -> str:
    """`--prometheus-match`: a label matcher in braces, as PromQL writes one."""
    text = text.strip()
    if not (text.startswith("{") and text.endswith("}")):
        raise ValueError(f"a label matcher in braces, e.g. '{{job=\"vllm\"}}', not {text!r}")
    return text


def seconds(duration: str) -> float:
    """A Prometheus duration (`15s`, `1m30s`) in seconds."""
    parts = _DURATION.findall(duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        return DEFAULT_INTERVAL_S
    return sum(float(n) * _SECONDS[u] for n, u in parts)


class Prometheus:
    """Readings of the series `match` picks, each once every instance was scraped after the
    reading began; `check()` first."""

    poll_s = 0.0  # each reading waits for a scrape of its own

    def __init__(self, url: str, match: str, http: aiohttp.ClientSession, timeout_s: float):
        self.url = base_url(url, "--prometheus")
        self.match = match
        self.http = http
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.target_labels = {"job", INSTANCE}
        self.interval_s = DEFAULT_INTERVAL_S

    @property
    def settle_s(self) -> float:
        return (FRESH_SCRAPES + 1) * self.interval_s

    def where(self) -> str:
        return f"Prometheus {self.url} {self.match}"

    def selector(self, names: str) -> str:
        """The series named (a regex) among those `match` picks."""
        inner = self.match.strip()[1:-1].strip().rstrip(",")
        return "{" + f'__name__=~"{names}"' + (f", {inner}" if inner else "") + "}"

    async def check(self) -> None:
        """Prometheus answers, takes the matcher, holds the queries series for it; the labels of
        its targets and how often it scrapes them."""
        probe = self.selector(series.exposed(series.QUERIES))
        try:
            found = await self.query(probe)
        except _Refused as e:
            raise UserError(f"--prometheus-match {self.match}: Prometheus refused it: "
                            f"{e.reason}") from None
        if not found:
            raise UserError(f"{self.where()}: no {series.exposed(series.QUERIES)} series: does it "
                            "scrape the fleet, with mmscope installed there?")
        instances = {s["metric"].get(INSTANCE, "") for s in found}
        targets = (await self._get_json(TARGETS_PATH, {"state": "active"}))["data"]
        scraped = [t for t in targets.get("activeTargets", [])
                   if t.get("labels", {}).get(INSTANCE) in instances]
        self.target_labels |= {name for t in scraped for name in t.get("labels", {})}
        self.interval_s = max((seconds(t.get("scrapeInterval", "")) for t in scraped),
                              default=DEFAULT_INTERVAL_S)

    async def read(self) -> Reading:
        await self._scraped_since(await self._now())
        names = "|".join((
            "vllm:.+_total",
            "vllm:(?:" + "|".join((*series.GAUGES, series.HOOK_OFF)) + ")",
            "vllm:(?:" + "|".join(series.READ_HISTOGRAMS) + ")_(?:bucket|sum|count)"))
        reading: Reading = defaultdict(lambda: defaultdict(float))
        for sample in await self.query(self.selector(names)):
            labels = dict(sample["metric"])
            name, instance = labels.pop("__name__"), labels.get(INSTANCE, "")
            own = {k: v for k, v in labels.items() if k not in self.target_labels}
            reading[instance][readout.series_key(name, own)] += float(sample["value"][1])
        return {instance: dict(values) for instance, values in reading.items()}

    async def _now(self) -> float:
        return float((await self.query("time()"))[0]["value"][0])

    async def _scraped_since(self, since: float) -> None:
        """Until each series of the fleet has a sample scraped after `since` (Prometheus' clock)."""
        stamps = f"timestamp({self.selector(series.exposed(series.QUERIES))})"
        wait_s = FRESH_SCRAPES * self.interval_s + FRESH_SLACK_S
        for _ in range(int(wait_s / POLL_S) + 1):
            found = await self.query(stamps)
            if found and min(float(s["value"][1]) for s in found) > since:
                return
            await asyncio.sleep(POLL_S)
        raise UserError(f"{self.where()}: no scrape of every instance within {wait_s:g} s")

    async def query(self, expr: str) -> list[dict]:
        """An instant query at Prometheus' now: its samples (a scalar as one)."""
        data = (await self._get_json(QUERY_PATH, {"query": expr}))["data"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    async def _get_json(self, path: str, params: dict) -> dict:
        try:
            async with self.http.get(self.url + path, params=params,
                                     timeout=self.timeout) as response:
                data = await response.read()
        except TimeoutError:
            raise UserError(f"Prometheus at {self.url} did not answer in time") from None
        except aiohttp.ClientConnectorError as e:
            raise UserError(f"cannot reach Prometheus at {self.url}: "
                            f"{one_line(str(e.os_error))}") from None
        except aiohttp.ClientError as e:
            raise UserError(f"talking to Prometheus at {self.url} failed: "
                            f"{one_line(str(e)) or type(e).__name__}") from None
        try:
            body = json.loads(data)
        except ValueError:
            raise UserError(f"{self.url}{path} did not answer JSON (HTTP {response.status}); is "
                            "this Prometheus?") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error") if isinstance(body, dict) else None
            if error is not None and response.status in (400, 422):
                reason = one_line(str(error))
                raise _Refused(f"Prometheus at {self.url} refused {params.get('query')!r}: "
                               f"{reason}", reason)
            raise UserError(f"{self.url}{path}: HTTP {response.status}"
                            + (f": {one_line(str(error))}" if error else ""))
        return body


class _Refused(UserError):
    """Prometheus took the request but refused the query (its PromQL did not parse)."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason
