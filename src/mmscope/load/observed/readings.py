"""Where a level's counters come from. A reading is, per instance, its series as
`mmscope.expose.readout` keys them: from each server's /metrics page (`Pages`) or from the
Prometheus that scrapes the fleet (load/observed/prometheus.py). A level's figures are two readings' deltas.
"""
from __future__ import annotations

import asyncio
from collections import defaultdict

from mmscope.expose import readout

Reading = dict[str, dict[str, float]]  # instance -> series key -> value
ONE_PAGE = "/metrics of the server"


class Pages:
    """Each server's /metrics page, all read at once; an instance is named by its URL."""

    poll_s = 0.2  # a level's last stats reach /metrics just after its last response
    settle_s = 5.0

    def __init__(self, servers):
        self.servers = servers

    def where(self) -> str:
        return "/metrics of each instance" if len(self.servers) > 1 else ONE_PAGE

    async def read(self) -> Reading:
        pages = await asyncio.gather(*(server.metrics() for server in self.servers))
        return {server.url: page for server, page in zip(self.servers, pages)}


def total(reading: Reading) -> dict[str, float]:
    """The fleet's series: every instance's summed."""
    out: dict[str, float] = defaultdict(float)
    for values in reading.values():
        for key, value in values.items():
            out[key] += value
    return dict(out)


def deltas(before: Reading, after: Reading) -> Reading:
    return {instance: readout.delta(before.get(instance, {}), after.get(instance, {}))
            for instance in sorted(before.keys() | after.keys())}
