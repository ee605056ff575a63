"""API-server wrappers (or the offline LLM's process): the counts from EngineCore into Prometheus
series and into vLLM's periodic stats line, and hooks turned off said there. Formatting only; the
counting happened in EngineCore.
"""
from __future__ import annotations

import functools
import logging
import threading
import weakref

from mmscope.carry import ttft
from mmscope.emit.stage_timer import FRONTEND, merge
from mmscope.expose.metrics import EncoderCacheProm
from mmscope.expose.ttft import TtftProm
from mmscope.carry import media as media_counts
from mmscope.vllm import media, request_times
from mmscope.vllm.encoder_outputs import bytes_per_embedding
from mmscope.vllm.patching import TURNED_OFF, in_release

# vLLM's logger objects -> ours, weakly: state of ours never hangs on a logger of vLLM's.
_prom: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # PrometheusStatLogger -> series
_windows: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # LoggingStatLogger -> window
# Hooks turned off (docs/design.md §9): engine index -> {hook: why}; None: in this process, which
# every engine's figures pass through. ROWS: hook -> (feature, process), from the target table.
HOOKS_OFF: dict[int | None, dict[str, str]] = {}
ROWS: dict[str, tuple[str, str]] = {}
ACCOUNTING, TTFT_PARTS = "accounting", "ttft_parts"


# --- PrometheusStatLogger: our series beside vLLM's -------------------------------------------
def prometheus_created(hook, wrapped, prom_logger, args, kwargs):
    result = wrapped(*args, **kwargs)
    try:
        modalities, capacity = encoder_cache_shape(prom_logger.vllm_config)
        table = hook.table
        ROWS.update({r.name: (r.feature, r.process) for r in table
                     if in_release(r, table.version)})
        prom = _prom[prom_logger] = EncoderCacheProm(
            prom_logger._counter_cls, prom_logger._gauge_cls, prom_logger._histogram_cls,
            prom_logger.per_engine_labelvalues, modalities, capacity,
            ec_connector=_has_ec_connector(prom_logger.vllm_config),
            bytes_per_embed=bytes_per_embedding(prom_logger.vllm_config.model_config),
            hooks=tuple((name, *row) for name, row in ROWS.items()))
        request_times.HISTOGRAMS[:] = [
            TtftProm(prom_logger._histogram_cls, prom_logger.per_engine_labelvalues)
        ] if modalities and ttft.enabled() else []
        for engine_idx, off in HOOKS_OFF.items():  # turned off before these series were made
            _withdraw(prom, off, engine_idx)
    except Exception as e:  # noqa: BLE001 - ours: the hook turns off, vLLM goes on
        hook.failed(e)
    return result


def _has_ec_connector(vllm_config) -> bool:
    config = vllm_config.ec_transfer_config
    return bool(config is not None and config.ec_connector)


def encoder_cache_shape(vllm_config) -> tuple[list[str], int | None]:
    """The modalities the model accepts and the encoder cache's capacity in embeddings, as the
    scheduler computes them (vLLM's MultiModalBudget), so that the series exist from the start.
    ([], None) for a text-only model."""
    model_config = vllm_config.model_config
    if not model_config.supports_multimodal_inputs:
        return [], None
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.encoder_budget import MultiModalBudget

    budget = MultiModalBudget(vllm_config, MULTIMODAL_REGISTRY, enable_cache=False)
    modalities = sorted(m for m, limit in budget.mm_limits.items() if limit > 0)
    return modalities, budget.encoder_cache_size


# --- StatLoggerManager.record: every logger of the step, one wrapper --------------------------
def stats_recorded(hook, wrapped, manager, args, kwargs, scheduler_stats, engine_idx):
    """Once every logger of vLLM's manager has recorded the step's stats: the Prometheus logger
    gets our series, each logging logger its hit-rate window. One wrapper on the manager rather
    than one per logger class: record() runs every step."""
    result = wrapped(*args, **kwargs)
    stats = scheduler_stats
    if stats is not None and (stats.encoder_cache_stats or stats.mm_stage_durations
                              or FRONTEND.pending or stats.mm_request_shares
                              or stats.mm_ec_transfers or stats.mm_hooks_off
                              or media.COUNTS.pending):
        try:
            engine_idx = engine_idx or 0
            if stats.mm_hooks_off:
                hooks_turned_off(stats.mm_hooks_off, engine_idx)
            if stats.mm_request_shares:
                request_times.engine_shares(stats.mm_request_shares, engine_idx)
            # The API server's media counts, like its stage durations, go out with this step's.
            counts = media.COUNTS.drain() if media.COUNTS.pending else None
            for stat_logger in manager.stat_loggers:
                _record(stat_logger, stats, engine_idx, counts)
        except Exception as e:  # noqa: BLE001
            hook.failed(e)
    return result


def _record(stat_logger, stats, engine_idx: int, counts: dict[str, int] | None) -> None:
    prom = _prom.get(stat_logger)
    if prom is not None:
        if counts:
            prom.observe_media(counts, engine_idx)
        if stats.encoder_cache_stats:
            prom.observe(stats.encoder_cache_stats, engine_idx)
        # API-server stages, timed in this process, go out with the worker's batch.
        if stats.mm_stage_durations or FRONTEND.pending:
            prom.observe_stages(merge(FRONTEND.drain(), stats.mm_stage_durations), engine_idx)
        if stats.mm_ec_transfers:
            prom.observe_transfers(stats.mm_ec_transfers, engine_idx)
        return
    per_engine = getattr(stat_logger, "per_engine_stat_loggers", None)  # vLLM's adapter
    if per_engine is not None:
        stat_logger = per_engine.get(engine_idx)
    if isinstance(stat_logger, _logging_stat_logger()):
        if stats.encoder_cache_stats:
            _to_hit_rate_window(stat_logger, stats.encoder_cache_stats)
        if counts:
            _to_redundant_tally(stat_logger, counts)


def hooks_turned_off(off: dict[str, str], engine_idx: int | None) -> None:
    """Hooks turned off in an engine's processes (None: in this one): `vllm:mmscope_hook_off`
    says which, what they fed is withdrawn, the stats line says the encoder-cache figures are
    off and why."""
    known = HOOKS_OFF.setdefault(engine_idx, {})
    new = {name: why for name, why in off.items() if name not in known}
    if not new:
        return
    known.update(new)
    for prom in list(_prom.values()):
        _withdraw(prom, new, engine_idx)


def _withdraw(prom, off: dict[str, str], engine_idx: int | None) -> None:
    for name in off:
        prom.hook_off(name, engine_idx)
        if ROWS.get(name, ("",))[0] == TTFT_PARTS:
            for histograms in request_times.HISTOGRAMS:
                histograms.withdraw(engine_idx)


def _local_hook_off(hook) -> None:
    """A hook of this process turned itself off (patching.TURNED_OFF's listener)."""
    hooks_turned_off({hook.name: hook.detail}, None)


def accounting_off(engine_idx: int) -> tuple[str, str] | None:
    """(hook, why) of an accounting hook turned off for the engine, or None."""
    for idx in (engine_idx, None):
        for name, why in HOOKS_OFF.get(idx, {}).items():
            if ROWS.get(name, ("",))[0] == ACCOUNTING:
                return name, why
    return None


@functools.cache
def _logging_stat_logger() -> type:
    from vllm.v1.metrics.loggers import LoggingStatLogger
    return LoggingStatLogger


# --- LoggingStatLogger: the windowed rate and the log-line suffix -----------------------------
class EncoderWindow:
    """Windowed rates over the most recent requests (vLLM's CachingMetrics, as beside the MM
    cache rate): the hit rate of queries; over the items sent, the share whose encoder work was
    avoided (a hit or the prefix cache) and the share the prefix cache covered; over the
    embeddings sent, the share of the encoder's work saved."""

    def __init__(self):
        from vllm.v1.metrics.stats import CachingMetrics

        self.hits = CachingMetrics()
        self.avoided = CachingMetrics()
        self.covered = CachingMetrics()
        self.saved = CachingMetrics()
        # media items fetched and decoded although the processor cache held them, and their
        # seconds, since the last stats line
        self.redundant = [0, 0]


def _window(log_logger) -> EncoderWindow:
    window = _windows.get(log_logger)
    if window is None:
        window = _windows[log_logger] = EncoderWindow()
    return window


def _to_redundant_tally(log_logger, counts: dict[str, int]) -> None:
    tally = _window(log_logger).redundant
    for key, n in counts.items():
        kind = key.partition(":")[0]
        if kind == media_counts.CACHED:
            tally[0] += n
        elif kind == media_counts.CACHED_NS:
            tally[1] += n


def _to_hit_rate_window(log_logger, wire: dict[str, int]) -> None:
    window = _window(log_logger)
    from vllm.v1.metrics.stats import BaseCacheStats

    queries, hits = wire.get("queries", 0), wire.get("hits", 0)
    covered, requests = wire.get("prefix_covered", 0), wire.get("requests", 0)
    if queries:
        window.hits.observe(BaseCacheStats(requests=requests, queries=queries, hits=hits))
    if queries or covered:
        sent = queries + covered
        window.avoided.observe(BaseCacheStats(requests=requests, queries=sent, hits=hits + covered))
        window.covered.observe(BaseCacheStats(requests=requests, queries=sent, hits=covered))
    spared = wire.get("hit_embeds", 0) + wire.get("prefix_covered_embeds", 0)
    embeds = wire.get("query_embeds", 0) + wire.get("prefix_covered_embeds", 0)
    if embeds:
        window.saved.observe(BaseCacheStats(requests=requests, queries=embeds, hits=spared))


_logging_now = threading.local()


def stats_logged(hook, wrapped, log_logger, args, kwargs):
    """LoggingStatLogger.log builds the stats line in one call with no extension point: the
    filter below appends to the line logged while this logger's log() runs on this thread."""
    _logging_now.logger = log_logger
    try:
        return wrapped(*args, **kwargs)
    finally:
        _logging_now.logger = None


class EncoderHitRateFilter(logging.Filter):
    """Appends `Encoder cache hit rate: X.X%`, the encoder work saved in embeddings (and the
    encoder work avoided per item sent, while the window holds items the prefix cache spared),
    and the media fetched though the processor cache held them since the last line, to the stats
    line of the logger whose log() is running."""

    MARKER = "Avg prompt throughput"

    def filter(self, record: logging.LogRecord) -> bool:
        stat_logger = getattr(_logging_now, "logger", None)
        if stat_logger is None or not isinstance(record.msg, str) or self.MARKER not in record.msg:
            return True
        args = tuple(record.args or ())
        off = accounting_off(getattr(stat_logger, "engine_index", 0))
        if off is not None:  # figures of a dead hook are no zeros: say why there are none
            record.msg += ", Encoder cache figures: off (mmscope hook %s turned itself off %s)"
            record.args = args + off
            return True
        window = _windows.get(stat_logger)
        if window is None:
            return True
        if not window.hits.empty:
            record.msg += ", Encoder cache hit rate: %.1f%%"
            args += (window.hits.hit_rate * 100,)
        if not window.saved.empty:  # hits and prefix-covered items, weighed by embeddings
            record.msg += ", Encoder work saved: %.1f%% of embeddings"
            args += (window.saved.hit_rate * 100,)
        if window.covered.hit_rate > 0:  # items the prefix cache spared lie in the window
            record.msg += ", Encoder work avoided: %.1f%% of items"
            args += (window.avoided.hit_rate * 100,)
        if window.redundant[0]:  # since the last line: fetches a cache by URL would have saved
            record.msg += ", Media fetched though cached: %d items, %.2f s"
            args += (window.redundant[0], window.redundant[1] / 1e9)
            window.redundant = [0, 0]
        record.args = args
        return True


def install_log_filter() -> None:
    """The stats line's filter, and the listener that says where hooks of this process turned
    off."""
    target = logging.getLogger("vllm.v1.metrics.loggers")
    if not any(isinstance(f, EncoderHitRateFilter) for f in target.filters):
        target.addFilter(EncoderHitRateFilter())
    if _local_hook_off not in TURNED_OFF.listeners:
        TURNED_OFF.listeners.append(_local_hook_off)


def remove_log_filter() -> None:
    target = logging.getLogger("vllm.v1.metrics.loggers")
    for f in [f for f in target.filters if isinstance(f, EncoderHitRateFilter)]:
        target.removeFilter(f)
    if _local_hook_off in TURNED_OFF.listeners:
        TURNED_OFF.listeners.remove(_local_hook_off)

