"""API-server wrappers of vLLM's stat loggers (or the offline LLM's): what EngineCore counted,
into mmscope's Prometheus series and into the stats line's window. Formatting only; the counting
happened in EngineCore.
"""
from __future__ import annotations

import functools
import weakref

from mmscope.carry import ttft_split
from mmscope.emit.stage_timer import FRONTEND, merge
from mmscope.expose.metrics import EncoderCacheProm, MetricClasses
from mmscope.expose.ttft_histograms import TtftProm
from mmscope.vllm.api_server import hooks_off, media_items, request_times, stats_line
from mmscope.vllm.encoder_outputs import bytes_per_embedding
from mmscope.vocabulary import Feature

# vLLM's PrometheusStatLogger -> our series, weakly: state of ours never hangs on vLLM's logger.
_prom: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def metric_classes(prom_logger) -> MetricClasses:
    """The metric classes the logger makes its own series with: prometheus_client's, or the
    wrappers vLLM's Ray logger sets in their place. vLLM's own extensions (its KV connectors'
    and perf metrics) read these class attributes the same way."""
    cls = type(prom_logger)
    return MetricClasses(cls._counter_cls, cls._gauge_cls, cls._histogram_cls)


# --- PrometheusStatLogger: our series beside vLLM's -------------------------------------------
def prometheus_created(hook, wrapped, prom_logger, args, kwargs):
    result = wrapped(*args, **kwargs)
    try:
        config = prom_logger.vllm_config
        modalities, capacity = encoder_cache_shape(config)
        labelvalues = prom_logger.per_engine_labelvalues
        prom = _prom[prom_logger] = EncoderCacheProm(
            metric_classes(prom_logger), labelvalues, modalities, capacity,
            ec_connector=_has_ec_connector(config),
            bytes_per_embed=bytes_per_embedding(config.model_config),
            hooks=hooks_off.know_rows(hook.table), listed=hooks_off.rows_that_apply(hook.table))
        request_times.HISTOGRAMS[:] = [
            TtftProm(metric_classes(prom_logger).histogram, labelvalues)
        ] if modalities and ttft_split.enabled() else []
        for engine_idx, off in hooks_off.OFF.items():  # turned off before these series were made
            _withdraw_from(prom, off, engine_idx)
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
    gets our series, each logging logger its window. One wrapper on the manager rather than one
    per logger class: record() runs every step."""
    result = wrapped(*args, **kwargs)
    stats = scheduler_stats
    if stats is not None and (stats.encoder_cache_stats or stats.mm_stage_durations
                              or FRONTEND.pending or stats.mm_request_shares
                              or stats.mm_ec_transfers or stats.mm_hooks_off
                              or media_items.COUNTS.pending):
        try:
            engine_idx = engine_idx or 0
            if stats.mm_hooks_off:
                hooks_off.turned_off(stats.mm_hooks_off, engine_idx)
            if stats.mm_request_shares:
                request_times.engine_shares(stats.mm_request_shares, engine_idx)
            # The API server's media counts, like its stage durations, go out with this step's.
            media = media_items.COUNTS.drain() if media_items.COUNTS.pending else None
            for stat_logger in manager.stat_loggers:
                _record(stat_logger, stats, engine_idx, media)
        except Exception as e:  # noqa: BLE001
            hook.failed(e)
    return result


def _record(stat_logger, stats, engine_idx: int, media: dict[str, int] | None) -> None:
    prom = _prom.get(stat_logger)
    if prom is not None:
        if media:
            prom.observe_media(media, engine_idx)
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
            stats_line.window(stat_logger).add_counts(stats.encoder_cache_stats)
        if media:
            stats_line.window(stat_logger).add_media(media)


@functools.cache
def _logging_stat_logger() -> type:
    from vllm.v1.metrics.loggers import LoggingStatLogger
    return LoggingStatLogger


# --- hooks turned off: what they fed leaves /metrics --------------------------------------------
def _withdraw(off: dict[str, str], engine_idx: int | None) -> None:
    for prom in list(_prom.values()):
        _withdraw_from(prom, off, engine_idx)


def _withdraw_from(prom: EncoderCacheProm, off: dict[str, str], engine_idx: int | None) -> None:
    for name in off:
        prom.hook_off(name, engine_idx)
        if hooks_off.feature_of(name) == Feature.TTFT_PARTS:
            for histograms in request_times.HISTOGRAMS:
                histograms.withdraw(engine_idx)


def install() -> None:
    """The stats line's filter, and where hooks turned off are told."""
    stats_line.install()
    hooks_off.listen()
    if _withdraw not in hooks_off.LISTENERS:
        hooks_off.LISTENERS.append(_withdraw)


def remove() -> None:
    stats_line.remove()
    hooks_off.stop_listening()
