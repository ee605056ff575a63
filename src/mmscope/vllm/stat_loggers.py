"""What the API-server hooks do with the counts: Prometheus series and the periodic log line.

Formatting only; the counting happened in EngineCore (`encoder_cache.py`).
"""
from __future__ import annotations

import bisect
import functools
import logging
import math
import threading
from collections import Counter

from mmscope.carry.ledger import SOURCES
from mmscope.emit.stage_timer import FRONTEND, merge
from mmscope.vllm import patching

# name, documentation: the counters next to vllm:prefix_cache_* and vllm:mm_cache_*; "encoder
# cache" everywhere so they cannot be mistaken for the processor cache (vllm:mm_cache_*).
COUNTERS = {
    "queries": ("vllm:encoder_cache_queries",
                "Encoder cache queries, in terms of number of multimodal items committed for "
                "scheduled requests (GPU encoder-output cache, not the processor cache)."),
    "hits": ("vllm:encoder_cache_hits",
             "Encoder cache hits, in terms of number of multimodal items whose encoder output "
             "was reused instead of recomputed."),
    "misses": ("vllm:encoder_cache_misses",
               "Encoder cache misses, in terms of number of multimodal items the encoder ran for."),
    "deferrals": ("vllm:encoder_cache_deferrals",
                  "Multimodal items deferred to a later step for lack of encoder compute budget "
                  "or encoder cache space (not counted as queries)."),
    "evictions": ("vllm:encoder_cache_evictions",
                  "Encoder cache entries evicted to make room, in terms of number of items."),
}
LABELED = {
    "hits_by_source": ("vllm:encoder_cache_hits_by_source", "source",
                       "Encoder cache hits by source: local (resident), in_step (computed by "
                       "another request in the same step), connector (loaded by the EC connector)."),
    "queries_by_modality": ("vllm:encoder_cache_queries_by_modality", "modality",
                            "Encoder cache queries by modality, in items."),
    "hits_by_modality": ("vllm:encoder_cache_hits_by_modality", "modality",
                         "Encoder cache hits by modality, in items."),
}
STAGE_HISTOGRAM = (
    "vllm:mm_stage_duration_seconds",
    "Host wall time of one multimodal pipeline stage (label stage: the mmscope range name, e.g. "
    "mm:hash:pil_image, mm:processor:hf_processor, gpu_model_runner: vit_forward). On a GPU the "
    "encoder figure is host time and includes waiting for the device only where vLLM waits.")
STAGE_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05,
                 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
GAUGES = {
    "usage_embeds": ("vllm:encoder_cache_usage_embeds",
                     "Encoder cache slots holding encoder outputs, in embeddings."),
    "capacity_embeds": ("vllm:encoder_cache_capacity_embeds",
                        "Encoder cache capacity, in embeddings."),
}


def wire_of(scheduler_stats) -> dict[str, int] | None:
    """The counts one SchedulerStats carries, in their wire form (EncoderCacheStats.to_wire):
    read as they come, with no parsing, since both loggers only add them up."""
    return scheduler_stats.encoder_cache_stats if scheduler_stats is not None else None


class EncoderCacheProm:
    """The Prometheus series, created by vLLM's PrometheusStatLogger right after its own (its
    __init__ unregisters every vllm:* collector first, so ours must come after)."""

    def __init__(self, counter_cls, gauge_cls, histogram_cls,
                 per_engine_labelvalues: dict[int, list]):
        labels = ["model_name", "engine"]
        self.labelvalues = per_engine_labelvalues
        self.counters = {k: counter_cls(name=n, documentation=d, labelnames=labels)
                         for k, (n, d) in COUNTERS.items()}
        self.labeled = {k: counter_cls(name=n, documentation=d, labelnames=labels + [extra])
                        for k, (n, extra, d) in LABELED.items()}
        self.gauges = {k: gauge_cls(name=n, documentation=d, labelnames=labels,
                                    multiprocess_mode="mostrecent")
                       for k, (n, d) in GAUGES.items()}
        self.stage_seconds = histogram_cls(
            name=STAGE_HISTOGRAM[0], documentation=STAGE_HISTOGRAM[1],
            labelnames=labels + ["stage"], buckets=STAGE_BUCKETS)
        # Children resolved once (labels() takes a lock and hashes the values on every call);
        # created now, so the series exist at zero and dashboards resolve at once.
        self._children: dict[tuple, object] = {}
        # (engine, wire key) -> the child's inc or set, or None for a key with no series of its own
        self._updates: dict[tuple[int, str], object] = {}
        for idx in per_engine_labelvalues:
            for key in (*self.counters, *self.gauges):
                self._child(idx, key)
            for source in SOURCES:
                self._child(idx, "hits_by_source", source)

    def _child(self, engine_idx: int, key: str, *extra: str):
        child = self._children.get((engine_idx, key, *extra))
        if child is None:
            metric = (self.counters.get(key) or self.gauges.get(key) or self.labeled.get(key)
                      or self.stage_seconds)
            child = metric.labels(*self.labelvalues[engine_idx], *extra)
            self._children[(engine_idx, key, *extra)] = child
        return child

    def _update_of(self, engine_idx: int, wire_key: str):
        """What a wire key does: `hits` -> the hits counter's inc, `hits_by_source:local` -> that
        label's inc, `usage_embeds` -> the gauge's set; `requests` (the log line's) -> None."""
        key, _, label = wire_key.partition(":")
        if label:
            update = self._child(engine_idx, key, label).inc if key in self.labeled else None
        elif key in self.gauges:
            update = self._child(engine_idx, key).set
        else:
            update = self._child(engine_idx, key).inc if key in self.counters else None
        self._updates[(engine_idx, wire_key)] = update
        return update

    def observe(self, wire: dict[str, int], engine_idx: int) -> None:
        if engine_idx not in self.labelvalues:
            return
        updates = self._updates
        for wire_key, n in wire.items():
            update = updates.get((engine_idx, wire_key), False)
            if update is False:
                update = self._update_of(engine_idx, wire_key)
            if update is not None and (n or wire_key in GAUGES):
                update(n)

    def observe_stages(self, durations: dict[str, list[int]], engine_idx: int) -> None:
        if engine_idx not in self.labelvalues:
            return
        for stage, ns in durations.items():
            observe_many(self._child(engine_idx, "stage_seconds", stage), ns)


def _threshold_ns(bound: float) -> int:
    """The largest integer d with d / 1e9 <= bound: integer durations then land in the bucket
    Histogram.observe(d / 1e9) would put them in."""
    if math.isinf(bound):
        return 2**63
    d = round(bound * 1e9)
    while d / 1e9 > bound:
        d -= 1
    while (d + 1) / 1e9 <= bound:
        d += 1
    return d


THRESHOLDS_NS = tuple(_threshold_ns(b) for b in (*STAGE_BUCKETS, math.inf))
_bucket_of = functools.partial(bisect.bisect_left, THRESHOLDS_NS)


def observe_many(child, durations_ns: list[int]) -> None:
    """Histogram.observe for a batch: bucket counts by bisection, then one increment per bucket
    touched, instead of a locked increment and a linear bucket search per value; in C where the
    extension is built. Falls back to observe() where the child is not prometheus_client's
    Histogram (e.g. Ray's)."""
    buckets, total = getattr(child, "_buckets", None), getattr(child, "_sum", None)
    if total is None or buckets is None or len(buckets) != len(THRESHOLDS_NS):
        for d in durations_ns:
            child.observe(d / 1e9)
        return
    native = patching._native
    if native is not None and type(durations_ns) is list:
        native.observe_batch(durations_ns, THRESHOLDS_NS, buckets, total, _mutex_value())
        return
    total.inc(sum(durations_ns) / 1e9)
    if len(durations_ns) < 16:  # a step's worth: a Counter would cost more than it saves
        for d in durations_ns:
            buckets[_bucket_of(d)].inc(1)
        return
    for i, n in Counter(map(_bucket_of, durations_ns)).items():
        buckets[i].inc(n)


@functools.cache
def _mutex_value() -> type:
    """prometheus_client's single-process value class, which observe_batch updates in place."""
    from prometheus_client.values import MutexValue
    return MutexValue


# --- StatLoggerManager.record: every logger of the step, one hook -----------------------------
def stats_recorded(result, manager, scheduler_stats, iteration_stats=None, mm_cache_stats=None,
                   engine_idx: int | None = None) -> None:
    """Runs only for stats that carry our fields (its guard in targets.py), once every logger of
    vLLM's manager has recorded them: the Prometheus logger gets our series, each logging logger
    its hit-rate window. One wrapper on the manager rather than one per logger class: record() is
    called every step, and each wrapped call costs a few microseconds in place."""
    engine_idx = 0 if engine_idx is None else engine_idx
    for stat_logger in manager.stat_loggers:
        if getattr(stat_logger, "_mmscope_prom", None) is not None:
            to_prometheus(stat_logger._mmscope_prom, scheduler_stats, engine_idx)
            continue
        per_engine = getattr(stat_logger, "per_engine_stat_loggers", None)  # vLLM's adapter
        if per_engine is not None:
            stat_logger = per_engine.get(engine_idx)
        if isinstance(stat_logger, _logging_stat_logger()):
            to_hit_rate_window(stat_logger, scheduler_stats)


@functools.cache
def _logging_stat_logger() -> type:
    from vllm.v1.metrics.loggers import LoggingStatLogger
    return LoggingStatLogger


# --- PrometheusStatLogger: our series beside vLLM's -------------------------------------------
def prom_created(result, prom_logger, *args, **kwargs) -> None:
    prom_logger._mmscope_prom = EncoderCacheProm(
        prom_logger._counter_cls, prom_logger._gauge_cls, prom_logger._histogram_cls,
        prom_logger.per_engine_labelvalues)


def to_prometheus(prom: EncoderCacheProm, scheduler_stats, engine_idx: int) -> None:
    """API-server stages, timed in this process, go out with the worker's batch."""
    if scheduler_stats is None:
        return
    wire = wire_of(scheduler_stats)
    if wire:
        prom.observe(wire, engine_idx)
    worker = scheduler_stats.mm_stage_durations
    if worker or FRONTEND.pending:
        prom.observe_stages(merge(FRONTEND.drain(), worker), engine_idx)


# --- LoggingStatLogger: the windowed rate and the log-line suffix -----------------------------
def to_hit_rate_window(log_logger, scheduler_stats) -> None:
    wire = wire_of(scheduler_stats)
    if not wire or not wire.get("queries"):
        return
    BaseCacheStats, CachingMetrics = _vllm_cache_stats()
    window = log_logger.__dict__.get("_mmscope_window")
    if window is None:
        window = log_logger._mmscope_window = CachingMetrics()  # same window as the MM cache rate
    window.observe(BaseCacheStats(requests=wire["requests"], queries=wire["queries"],
                                  hits=wire["hits"]))


@functools.cache
def _vllm_cache_stats():
    # Imported on first use, not at plugin load: vLLM may still be importing itself then.
    from vllm.v1.metrics.stats import BaseCacheStats, CachingMetrics
    return BaseCacheStats, CachingMetrics


_logging_now = threading.local()


def log_begin(log_logger, *args, **kwargs):
    _logging_now.logger = log_logger
    return log_logger  # the token: log_end must always run


def log_end(token, result, log_logger, *args, **kwargs):
    _logging_now.logger = None


class EncoderHitRateFilter(logging.Filter):
    """Appends `Encoder cache hit rate: X.X%` to the stats line of the LoggingStatLogger whose
    log() is running on this thread. vLLM builds that line in one call with no extension point."""

    MARKER = "Avg prompt throughput"

    def filter(self, record: logging.LogRecord) -> bool:
        stat_logger = getattr(_logging_now, "logger", None)
        if stat_logger is None or not isinstance(record.msg, str) or self.MARKER not in record.msg:
            return True
        window = stat_logger.__dict__.get("_mmscope_window")
        if window is not None and not window.empty:
            record.msg += ", Encoder cache hit rate: %.1f%%"
            record.args = tuple(record.args or ()) + (window.hit_rate * 100,)
        return True


def install_log_filter() -> None:
    target = logging.getLogger("vllm.v1.metrics.loggers")
    if not any(isinstance(f, EncoderHitRateFilter) for f in target.filters):
        target.addFilter(EncoderHitRateFilter())


def remove_log_filter() -> None:
    target = logging.getLogger("vllm.v1.metrics.loggers")
    for f in [f for f in target.filters if isinstance(f, EncoderHitRateFilter)]:
        target.removeFilter(f)
