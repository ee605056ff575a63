"""The words mmscope's figures are made of, each defined once: the features a hook serves, the
processes it runs in, an encoder input's outcomes, a hit's sources and an item's way through the
cache layers.

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


class ProcessorWay(enum.StrEnum):
    """What vLLM's processor cache (--mm-processor-cache-gb) did for an item: held its processed
    inputs (the HF processor skipped), looked it up in vain, or never looked (off, or bypassed)."""

    HIT = "hit"
    MISS = "miss"
    OFF = "off"


class EncoderWay(enum.StrEnum):
    """Where an item's embeddings came from at its final outcome (a deferral is none):
    the encoder cache (a hit resident or computed in the same step), the prefix cache (its
    placeholders all in KV), the EC connector (loaded), or the encoder itself."""

    CACHE_HIT = "cache_hit"
    PREFIX_COVERED = "prefix_covered"
    EC_LOADED = "ec_loaded"
    COMPUTED = "computed"


class Layer(enum.StrEnum):
    """The cache layers that spare an item work, as the work they saved is labelled."""

    PROCESSOR_CACHE = "processor_cache"  # the HF processor's run
    PREFIX_CACHE = "prefix_cache"  # the encoder's run (the item's tokens were already in KV)
    ENCODER_CACHE = "encoder_cache"  # the encoder's run
    EC_CONNECTOR = "ec_connector"  # the encoder's run, less the load's


# The layer whose work an encoder way spared (computed: none)
LAYER_OF = {EncoderWay.CACHE_HIT: Layer.ENCODER_CACHE, EncoderWay.PREFIX_COVERED: Layer.PREFIX_CACHE,
            EncoderWay.EC_LOADED: Layer.EC_CONNECTOR}
