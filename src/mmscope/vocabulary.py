"""The words mmscope's figures are made of, each defined once: the features a hook serves, the
processes it runs in, an encoder input's outcomes and a hit's sources.

Stage (range) names live in stages.py, series names in expose/metrics.py.
"""
from __future__ import annotations

import enum


class Feature(enum.StrEnum):
    """What a hook feeds; MMSCOPE_SKIP_HOOKS names features, and a hook turned off withdraws
    its feature's figures (docs/design.md §5 "Controls", §9)."""

    ACCOUNTING = "accounting"  # the encoder-cache counts
    METRICS = "metrics"  # the series and the stats line
    RANGES = "ranges"  # the stage ranges and their durations
    TELEMETRY = "telemetry"  # the step's shape
    TTFT_PARTS = "ttft_parts"  # each request's time to first token by part (opt-in)
    OTLP = "otlp"  # vLLM's request span, enriched


class Process(enum.StrEnum):
    """The vLLM process a hook runs in."""

    ENGINE_CORE = "EngineCore"
    API_SERVER = "API server"
    WORKER = "worker"


class Outcome(enum.StrEnum):
    """A committed encoder input's outcome (docs/design.md §4): the probe line's, the access
    log's and the request span's word for it."""

    HIT = "HIT"
    MISS = "MISS"
    DEFERRED = "DEFERRED"
    PREFIX_COVERED = "PREFIX_COVERED"


# Where a hit's embeddings came from: resident in the cache, computed by another request of the
# same step, loaded by the EC connector.
LOCAL, IN_STEP, CONNECTOR = "local", "in_step", "connector"
HIT_SOURCES = (LOCAL, IN_STEP, CONNECTOR)
