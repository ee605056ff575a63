"""The encoder-cache counts' wire form, added key by key to real prometheus_client series: what
the API server's PrometheusStatLogger hook does with each SchedulerStats that carries them."""
from __future__ import annotations

import functools

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mmscope.carry.ledger import Decision, EncoderCacheLedger, Item
from mmscope.expose.metrics import COUNTERS, LABELED, EncoderCacheProm, MetricClasses
from mmscope.vocabulary import HIT_SOURCES as SOURCES

ENGINES = {0: ["tiny", "0"], 1: ["tiny", "1"]}


def _prom(modalities=(), capacity=None, engines=None, bytes_per_embed=None):
    registry = CollectorRegistry()
    classes = (functools.partial(cls, registry=registry) for cls in (Counter, Gauge, Histogram))
    return registry, EncoderCacheProm(MetricClasses(*classes), engines or {0: ["tiny", "0"]}, modalities,
                                      capacity, bytes_per_embed=bytes_per_embed)


def _samples(registry, engine="0") -> dict[tuple, float]:
    return {(s.name, s.labels.get("source") or s.labels.get("modality")): s.value
            for family in text_string_to_metric_families(generate_latest(registry).decode())
            for s in family.samples
            if not s.name.endswith("_created") and s.labels.get("engine") == engine
            and not s.name.startswith(("vllm:mm_stage_duration", "vllm:mm_media_"))}


def _wire(*decisions: tuple[int, Decision, str]) -> dict[str, int]:
    ledger = EncoderCacheLedger()
    for index, decision, modality in decisions:
        ledger.propose(Item("r", index, modality, f"k{index}", 16), decision)
    ledger.commit_step({"r"}, {"r": [i for i, d, _ in decisions if d is Decision.COMPUTE]})
    ledger.occupancy(48, 256)
    return ledger.drain().to_wire()


def test_two_emissions_add_up_per_key_and_the_gauges_take_the_last():
    registry, prom = _prom()
    prom.observe(_wire((0, Decision.COMPUTE, "image"), (1, Decision.LOCAL_HIT, "image")), 0)
    prom.observe(_wire((0, Decision.CONNECTOR, "video"), (1, Decision.DUPLICATE, "image")), 0)
    s = _samples(registry)
    assert s[("vllm:encoder_cache_queries_total", None)] == 4
    assert s[("vllm:encoder_cache_hits_total", None)] == 3
    assert s[("vllm:encoder_cache_misses_total", None)] == 1
    assert s[("vllm:encoder_cache_hits_by_source_total", "local")] == 1
    assert s[("vllm:encoder_cache_hits_by_source_total", "connector")] == 1
    assert s[("vllm:encoder_cache_hits_by_source_total", "in_step")] == 1
    assert s[("vllm:encoder_cache_queries_by_modality_total", "image")] == 3
    assert s[("vllm:encoder_cache_hits_by_modality_total", "video")] == 1
    assert s[("vllm:encoder_cache_usage_embeds", None)] == 48
    assert s[("vllm:encoder_cache_capacity_embeds", None)] == 256
    prom.observe({"usage_embeds": 16, "capacity_embeds": 256}, 0)
    assert _samples(registry)[("vllm:encoder_cache_usage_embeds", None)] == 16
    assert ("vllm:encoder_cache_usage_bytes", None) not in s  # the outputs' width not given


def test_the_occupancy_in_bytes_follows_the_embeddings():
    registry, prom = _prom(bytes_per_embed=128)
    prom.observe({"usage_embeds": 48, "capacity_embeds": 256}, 0)
    prom.observe({"usage_embeds": 16, "capacity_embeds": 256}, 0)
    s = _samples(registry)
    assert s[("vllm:encoder_cache_usage_bytes", None)] == 16 * 128
    assert s[("vllm:encoder_cache_capacity_bytes", None)] == 256 * 128


def test_a_gauge_goes_back_to_zero_and_unknown_keys_or_engines_are_ignored():
    registry, prom = _prom()
    prom.observe({"usage_embeds": 48, "capacity_embeds": 256}, 0)
    prom.observe({"usage_embeds": 0, "capacity_embeds": 256, "requests": 3, "later_field": 1,
                  "later_group:x": 1}, 0)
    prom.observe({"queries": 5}, 7)  # an engine this logger does not serve
    s = _samples(registry)
    assert s[("vllm:encoder_cache_usage_embeds", None)] == 0
    assert s[("vllm:encoder_cache_queries_total", None)] == 0
    assert s[("vllm:encoder_cache_hits_total", None)] == 0
    assert not any(label == "x" for _, label in s)


def test_a_label_on_a_series_without_that_label_is_ignored():
    """A wire key `hits:x` names no series (hits has no extra label): ignored like any unknown
    key, not an error that would turn the stat_loggers.record hook off."""
    registry, prom = _prom()
    prom.observe({"hits:odd_label": 1, "queries": 2}, 0)
    s = _samples(registry)
    assert s[("vllm:encoder_cache_hits_total", None)] == 0
    assert s[("vllm:encoder_cache_queries_total", None)] == 2


def test_every_labelled_series_exists_at_zero_before_any_count():
    """rate() and increase() see a series rise only from a sample at 0: every source, every
    modality given and every engine is there from the start, the capacity at its value."""
    registry, prom = _prom(["audio", "image"], capacity=8192, engines=ENGINES,
                           bytes_per_embed=4096 * 2)
    expected = {(name + "_total", None): 0.0 for name, _ in COUNTERS.values()}
    for key, (name, extra, _) in LABELED.items():
        labels = SOURCES if extra == "source" else ("audio", "image")
        expected.update({(name + "_total", label): 0.0 for label in labels})
    expected[("vllm:encoder_cache_usage_embeds", None)] = 0.0
    expected[("vllm:encoder_cache_capacity_embeds", None)] = 8192.0
    expected[("vllm:encoder_cache_usage_bytes", None)] = 0.0
    expected[("vllm:encoder_cache_capacity_bytes", None)] = 8192.0 * 8192
    for engine in ("0", "1"):
        assert _samples(registry, engine) == expected


def test_every_media_series_exists_at_zero_for_each_source_and_modality():
    registry, prom = _prom(["audio", "image"], engines=ENGINES)
    found = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name.startswith("vllm:mm_media_") and not s.name.endswith("_created"):
                labels = {k: v for k, v in s.labels.items() if k != "model_name"}
                found[(s.name, tuple(sorted(labels.items())))] = s.value
    sources, modalities = ("http", "data_url", "file"), ("audio", "image")
    expected = {}
    for engine in ("0", "1"):
        for source in sources:
            for m in modalities:
                for name in ("fetched_bytes", "redundant_fetches", "redundant_fetch_seconds"):
                    expected[(f"vllm:mm_media_{name}_total", (("engine", engine),
                              ("modality", m), ("source", source)))] = 0.0
                for step in ("fetch", "decode"):
                    expected[("vllm:mm_media_failed_fetches_total", (
                        ("engine", engine), ("modality", m), ("source", source),
                        ("step", step)))] = 0.0
    assert found == expected
    prom.observe_media({"bytes:http:image": 2048, "cached_ns:http:image": 1_500_000_000}, 1)
    s = {k: v for k, v in _all(registry).items() if k[1] == "1"}
    assert s[("vllm:mm_media_fetched_bytes_total", "1", "http", "image")] == 2048
    assert s[("vllm:mm_media_redundant_fetch_seconds_total", "1", "http", "image")] == 1.5


def _all(registry) -> dict[tuple, float]:
    return {(s.name, s.labels["engine"], s.labels["source"], s.labels["modality"]): s.value
            for family in text_string_to_metric_families(generate_latest(registry).decode())
            for s in family.samples
            if s.name.startswith("vllm:mm_media_") and "step" not in s.labels
            and not s.name.endswith("_created")}


def test_a_text_only_model_has_its_source_series_and_no_capacity():
    registry, prom = _prom([], capacity=None)
    s = _samples(registry)
    assert {src for (name, src) in s if name == "vllm:encoder_cache_hits_by_source_total"} == \
        set(SOURCES)
    assert not any("by_modality" in name for name, _ in s)
    assert s[("vllm:encoder_cache_capacity_embeds", None)] == 0


def test_prefix_covered_items_are_their_own_series_and_no_query():
    registry, prom = _prom(["image"])
    ledger = EncoderCacheLedger()
    ledger.prefix_covered(Item("r", 0, "image", "k0", 16))
    ledger.propose(Item("r", 1, "image", "k1", 16), Decision.COMPUTE)
    ledger.commit_step({"r"}, {"r": [1]})
    prom.observe(ledger.drain().to_wire(), 0)
    s = _samples(registry)
    assert s[("vllm:encoder_cache_prefix_covered_total", None)] == 1
    assert s[("vllm:encoder_cache_prefix_covered_by_modality_total", "image")] == 1
    assert s[("vllm:encoder_cache_queries_total", None)] == 1
    assert s[("vllm:encoder_cache_misses_total", None)] == 1
    assert s[("vllm:encoder_cache_hits_total", None)] == 0
