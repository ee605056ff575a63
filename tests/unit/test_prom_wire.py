"""The encoder-cache counts' wire form, added key by key to real prometheus_client series: what
the API server's PrometheusStatLogger hook does with each SchedulerStats that carries them."""
from __future__ import annotations

import functools
from types import SimpleNamespace as NS

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mmscope.carry.ledger import Decision, EncoderCacheLedger, Item
from mmscope.vllm import stat_loggers as sl


def _prom():
    registry = CollectorRegistry()
    classes = (functools.partial(cls, registry=registry) for cls in (Counter, Gauge, Histogram))
    return registry, sl.EncoderCacheProm(*classes, {0: ["tiny", "0"]})


def _samples(registry) -> dict[tuple, float]:
    return {(s.name, s.labels.get("source") or s.labels.get("modality")): s.value
            for family in text_string_to_metric_families(generate_latest(registry).decode())
            for s in family.samples if not s.name.endswith("_created")}


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


def test_a_gauge_goes_back_to_zero_and_unknown_keys_or_engines_are_ignored():
    registry, prom = _prom()
    prom.observe({"usage_embeds": 48, "capacity_embeds": 256}, 0)
    prom.observe({"usage_embeds": 0, "capacity_embeds": 256, "requests": 3, "later_field": 1,
                  "later_group:x": 1, "hits:odd_label": 1}, 0)
    prom.observe({"queries": 5}, 7)  # an engine this logger does not serve
    s = _samples(registry)
    assert s[("vllm:encoder_cache_usage_embeds", None)] == 0
    assert s[("vllm:encoder_cache_queries_total", None)] == 0
    assert s[("vllm:encoder_cache_hits_total", None)] == 0


def test_the_manager_hook_feeds_every_logger_of_vllms_manager():
    """StatLoggerManager.record's observer: our series on the Prometheus logger, and a hit-rate
    window on each logging logger, per engine behind vLLM's adapter or aggregated."""
    from vllm.v1.metrics.loggers import (AggregatedLoggingStatLogger, LoggingStatLogger,
                                         PerEngineStatLoggerAdapter)

    registry, prom = _prom()
    prometheus_logger = NS(_mmscope_prom=prom)
    per_engine = {0: object.__new__(LoggingStatLogger), 1: object.__new__(LoggingStatLogger)}
    adapter = object.__new__(PerEngineStatLoggerAdapter)
    adapter.per_engine_stat_loggers = per_engine
    aggregated = object.__new__(AggregatedLoggingStatLogger)
    manager = NS(stat_loggers=[adapter, aggregated, prometheus_logger, NS()])  # NS(): a custom one
    wire = _wire((0, Decision.COMPUTE, "image"), (1, Decision.LOCAL_HIT, "image"))
    sl.stats_recorded(None, manager, scheduler_stats=NS(encoder_cache_stats=wire,
                                                        mm_stage_durations=None),
                      iteration_stats=None, mm_cache_stats=None)  # engine_idx omitted: 0
    assert _samples(registry)[("vllm:encoder_cache_hits_total", None)] == 1
    assert per_engine[0]._mmscope_window.hit_rate == 0.5
    assert aggregated._mmscope_window.hit_rate == 0.5
    assert "_mmscope_window" not in vars(per_engine[1])  # another engine's logger
