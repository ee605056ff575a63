"""vLLM's periodic stats line gains the encoder cache's windowed rates and the media fetched
though cached (docs/design.md §5), or says why the figures are off.

LoggingStatLogger.log builds its line in one call with no extension point: a filter on its
logger appends to the line logged while a logger's log() runs on this thread.
"""
from __future__ import annotations

import logging
import threading
import weakref

from mmscope.carry import counts, media_loads
from mmscope.carry.ledger import EncoderCacheStats
from mmscope.vllm.api_server import hooks_off

LOGGER = "vllm.v1.metrics.loggers"
# vLLM's LoggingStatLogger -> its window, weakly: state of ours never hangs on a logger of vLLM's
_windows: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


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

    def add_counts(self, wire: dict[str, int]) -> None:
        from vllm.v1.metrics.stats import BaseCacheStats

        s = EncoderCacheStats.from_wire(wire)
        if s.queries:
            self.hits.observe(BaseCacheStats(requests=s.requests, queries=s.queries, hits=s.hits))
        if s.queries or s.prefix_covered:
            sent = s.queries + s.prefix_covered
            self.avoided.observe(BaseCacheStats(requests=s.requests, queries=sent,
                                                hits=s.hits + s.prefix_covered))
            self.covered.observe(BaseCacheStats(requests=s.requests, queries=sent,
                                                hits=s.prefix_covered))
        embeds = s.query_embeds + s.prefix_covered_embeds
        if embeds:
            self.saved.observe(BaseCacheStats(requests=s.requests, queries=embeds,
                                              hits=s.hit_embeds + s.prefix_covered_embeds))

    def add_media(self, wire: dict[str, int]) -> None:
        for wire_key, n in wire.items():
            kind = counts.split(wire_key)[0]
            if kind == media_loads.CACHED:
                self.redundant[0] += n
            elif kind == media_loads.CACHED_NS:
                self.redundant[1] += n


def window(log_logger) -> EncoderWindow:
    found = _windows.get(log_logger)
    if found is None:
        found = _windows[log_logger] = EncoderWindow()
    return found


_logging_now = threading.local()


def stats_logged(hook, wrapped, log_logger, args, kwargs):
    """LoggingStatLogger.log: the filter appends to what this logger logs during the call."""
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
        off = hooks_off.accounting_off(getattr(stat_logger, "engine_index", 0))
        if off is not None:  # figures of a dead hook are no zeros: say why there are none
            record.msg += ", Encoder cache figures: off (mmscope hook %s turned itself off %s)"
            record.args = args + off
            return True
        found = _windows.get(stat_logger)
        if found is None:
            return True
        if not found.hits.empty:
            record.msg += ", Encoder cache hit rate: %.1f%%"
            args += (found.hits.hit_rate * 100,)
        if not found.saved.empty:  # hits and prefix-covered items, weighed by embeddings
            record.msg += ", Encoder work saved: %.1f%% of embeddings"
            args += (found.saved.hit_rate * 100,)
        if found.covered.hit_rate > 0:  # items the prefix cache spared lie in the window
            record.msg += ", Encoder work avoided: %.1f%% of items"
            args += (found.avoided.hit_rate * 100,)
        if found.redundant[0]:  # since the last line: fetches a cache by URL would have saved
            record.msg += ", Media fetched though cached: %d items, %.2f s"
            args += (found.redundant[0], found.redundant[1] / 1e9)
            found.redundant = [0, 0]
        record.args = args
        return True


def install() -> None:
    target = logging.getLogger(LOGGER)
    if not any(isinstance(f, EncoderHitRateFilter) for f in target.filters):
        target.addFilter(EncoderHitRateFilter())


def remove() -> None:
    target = logging.getLogger(LOGGER)
    for f in [f for f in target.filters if isinstance(f, EncoderHitRateFilter)]:
        target.removeFilter(f)
