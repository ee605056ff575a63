"""The EC connector's transfer counts: the worker's wrappers count items and the tensors' bytes of
load and save exactly; the series exist at 0 per direction where a connector is configured."""
from __future__ import annotations

import functools

import pytest
import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mmscope import stages
from mmscope.emit.stage_timer import WORKER
from mmscope.carry.transfers import DIRECTIONS
from mmscope.expose.metrics import EncoderCacheProm, MetricClasses
from mmscope.vllm import patching
from mmscope.vllm.worker import preprocess_stages as worker_stages
from mmscope.carry.transfers import TRANSFERS
from mmscope.vllm.patching import Hook


class Connector:  # ECExampleConnector's way: load what the metadata names and the cache lacks
    def __init__(self, role, stored):
        self.role, self.stored = role, stored
        self.is_producer = self.is_consumer = True
        self.wanted: list[str] = []

    def start_load_caches(self, encoder_cache, **kwargs):
        for mm_hash in self.wanted:
            if mm_hash not in encoder_cache:
                encoder_cache[mm_hash] = self.stored[mm_hash].clone()

    def save_caches(self, encoder_cache, mm_hash, **kwargs):
        self.stored[mm_hash] = encoder_cache[mm_hash].clone()


class Factory:  # ECConnectorFactory.create_connector's signature
    @classmethod
    def create_connector(cls, config, role):
        return Connector(role, config)


@pytest.fixture
def connector():
    from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole

    hook = Hook("test.ec_transfers", f"{__name__}:Factory.create_connector",
                ("role",), worker_stages.connector_created, "ranges", "worker")
    hook.apply()
    try:
        made = Factory.create_connector({}, ECConnectorRole.WORKER)
    finally:
        hook.revert()
    TRANSFERS.drain(), WORKER.drain()
    yield made
    patching.unwrap_instances()
    TRANSFERS.drain(), WORKER.drain()


def test_save_and_load_count_one_item_per_mm_hash_and_the_tensors_bytes(connector):
    a = torch.zeros(16, 32, dtype=torch.bfloat16)  # 16 embeddings of 32: 1024 bytes
    b = torch.zeros(9, 32, dtype=torch.float32)  # 1152 bytes
    produced = {"a": a, "b": b}
    connector.save_caches(produced, "a")
    connector.save_caches(encoder_cache=produced, mm_hash="b")
    saved = TRANSFERS.drain()
    assert {k: v for k, v in saved.items() if not k.startswith("ns:")} == {
        "items:save": 2, "bytes:save": 1024 + 1152}
    assert saved["ns:save"] > 0

    consumer_cache = {"resident": torch.zeros(4)}
    connector.wanted = ["a", "b", "resident"]
    connector.start_load_caches(consumer_cache)
    loaded = TRANSFERS.drain()
    assert (loaded["items:load"], loaded["bytes:load"]) == (2, 1024 + 1152)
    assert loaded["ns:load"] > 0 and set(loaded) == {"items:load", "bytes:load", "ns:load"}

    connector.start_load_caches(consumer_cache)  # all resident: a stage sample, no transfer
    assert not TRANSFERS.pending
    assert len(WORKER.drain()[stages.EC_LOAD]) == 2


def exposition(registry) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name.startswith("vllm:ec_connector") and s.name.endswith("_total"):
                out[(s.name, s.labels["engine"], s.labels["direction"])] = s.value
    return out


def prom(registry, ec_connector: bool) -> EncoderCacheProm:
    classes = [functools.partial(c, registry=registry) for c in (Counter, Gauge, Histogram)]
    return EncoderCacheProm(MetricClasses(*classes), {0: ["tiny", "0"], 1: ["tiny", "1"]}, ["image"], 64,
                            ec_connector=ec_connector)


def test_transfer_series_exist_at_zero_per_engine_and_direction_and_add_up():
    registry = CollectorRegistry()
    series = prom(registry, ec_connector=True)
    names = ("items", "bytes", "seconds")
    assert exposition(registry) == {
        (f"vllm:ec_connector_transfer_{n}_total", e, d): 0.0
        for n in names for e in ("0", "1") for d in DIRECTIONS}
    series.observe_transfers({"items:load": 2, "bytes:load": 3200, "ns:load": 1_500_000_000}, 1)
    series.observe_transfers({"items:load": 1, "bytes:load": 1600, "ns:load": 500_000_000}, 1)
    got = exposition(registry)
    assert got[("vllm:ec_connector_transfer_items_total", "1", "load")] == 3
    assert got[("vllm:ec_connector_transfer_bytes_total", "1", "load")] == 4800
    assert got[("vllm:ec_connector_transfer_seconds_total", "1", "load")] == pytest.approx(2.0)
    assert sum(got.values()) == pytest.approx(3 + 4800 + 2.0)  # nothing on engine 0 or save


def test_no_transfer_series_without_a_connector():
    registry = CollectorRegistry()
    prom(registry, ec_connector=False).observe_transfers({"items:load": 1}, 0)
    assert exposition(registry) == {}
