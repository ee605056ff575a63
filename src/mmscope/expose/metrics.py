"""The Prometheus series of the encoder cache and the stage timer: names, help texts, labels, and
`EncoderCacheProm`, which adds the counts' wire form and the stage durations to them.

Names and labels sit beside vLLM's own `vllm:prefix_cache_*` and `vllm:mm_cache_*`.
"""
from __future__ import annotations

from typing import NamedTuple

from mmscope import stages
from mmscope.carry import counts, media_loads, transfers
from mmscope.vocabulary import HIT_SOURCES, Feature

# wire key -> (name, documentation); "encoder cache" everywhere so that they cannot be taken for
# the processor cache (vllm:mm_cache_*).
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
    "prefix_covered": ("vllm:encoder_cache_prefix_covered",
                       "Multimodal items whose placeholder tokens all lay in prefix-cache hits "
                       "when their request was scheduled: encoder work avoided without an "
                       "encoder cache query (not counted as queries)."),
    # The same outcomes in embeddings (an item's encoder-output rows): what the encoder's work
    # and the cache's room are made of, so a large video weighs more than a thumbnail.
    "query_embeds": ("vllm:encoder_cache_query_embeds",
                     "Encoder cache queries, in terms of embeddings (encoder-output rows) of the "
                     "items queried."),
    "hit_embeds": ("vllm:encoder_cache_hit_embeds",
                   "Encoder cache hits, in terms of embeddings the encoder did not recompute."),
    "miss_embeds": ("vllm:encoder_cache_miss_embeds",
                    "Embeddings the encoder computed for missed items."),
    "prefix_covered_embeds": ("vllm:encoder_cache_prefix_covered_embeds",
                              "Embeddings of items the prefix cache spared (no encoder cache "
                              "query)."),
}
# wire key -> (name, extra label, documentation)
LABELED = {
    "hits_by_source": ("vllm:encoder_cache_hits_by_source", "source",
                       "Encoder cache hits by source: local (resident), in_step (computed by "
                       "another request in the same step), connector (loaded by the EC connector)."),
    "queries_by_modality": ("vllm:encoder_cache_queries_by_modality", "modality",
                            "Encoder cache queries by modality, in items."),
    "hits_by_modality": ("vllm:encoder_cache_hits_by_modality", "modality",
                         "Encoder cache hits by modality, in items."),
    "prefix_covered_by_modality": ("vllm:encoder_cache_prefix_covered_by_modality", "modality",
                                   "Multimodal items spared by the prefix cache, by modality."),
    "hit_embeds_by_source": ("vllm:encoder_cache_hit_embeds_by_source", "source",
                             "Encoder cache hits by source, in embeddings."),
    "query_embeds_by_modality": ("vllm:encoder_cache_query_embeds_by_modality", "modality",
                                 "Encoder cache queries by modality, in embeddings."),
    "hit_embeds_by_modality": ("vllm:encoder_cache_hit_embeds_by_modality", "modality",
                               "Encoder cache hits by modality, in embeddings."),
}
GAUGES = {
    "usage_embeds": ("vllm:encoder_cache_usage_embeds",
                     "Encoder cache slots holding encoder outputs, in embeddings."),
    "capacity_embeds": ("vllm:encoder_cache_capacity_embeds",
                        "Encoder cache capacity, in embeddings."),
    # the same in bytes: embeddings x the encoder output's width x its dtype's size
    "usage_bytes": ("vllm:encoder_cache_usage_bytes",
                    "Encoder cache occupancy in bytes of encoder outputs, as the worker holds "
                    "them (embeddings x hidden size x dtype size)."),
    "capacity_bytes": ("vllm:encoder_cache_capacity_bytes",
                       "Encoder cache capacity in bytes of encoder outputs."),
}
BYTES_OF = {"usage_embeds": "usage_bytes", "capacity_embeds": "capacity_bytes"}
# The EC connector's transfers, by direction (carry/transfers.py; seconds travel in ns).
TRANSFER_COUNTERS = {
    transfers.ITEMS: ("vllm:ec_connector_transfer_items",
                      "Multimodal items the EC connector moved: loaded into this instance's "
                      "encoder cache, or saved from it (one per mm_hash)."),
    transfers.BYTES: ("vllm:ec_connector_transfer_bytes",
                      "Bytes of encoder outputs the EC connector moved (the tensors' nbytes)."),
    transfers.NS: ("vllm:ec_connector_transfer_seconds",
                   "Host wall time of the EC connector's load and save calls that moved items, "
                   "including the copy between host and device."),
}
# The API server's media before the processor, by source and modality (wire key "<kind>:..."
# of carry/media_loads.py; seconds travel in ns).
MEDIA = {
    media_loads.BYTES: ("vllm:mm_media_fetched_bytes", ("source", "modality"),
                  "Bytes of multimodal items fetched before the processor (an HTTP body, a file "
                  "read, a data URL's base64 decoded), by source (http, data_url, file)."),
    media_loads.FAILED: ("vllm:mm_media_failed_fetches", ("step", "source", "modality"),
                   "Multimodal items whose fetch failed (step fetch: refused, an HTTP error, a "
                   "bad URL; step decode: bytes that are no media of that kind); vLLM then "
                   "answers the request with an error."),
    media_loads.CACHED: ("vllm:mm_media_redundant_fetches", ("source", "modality"),
                   "Multimodal items fetched and decoded although vLLM's processor cache already "
                   "held their content (a miss only in a URL-keyed cache)."),
    media_loads.CACHED_NS: ("vllm:mm_media_redundant_fetch_seconds", ("source", "modality"),
                      "Fetch and decode time of those items (wall time per item): what a client "
                      "or proxy cache by URL would have saved."),
}
STAGE_HISTOGRAM = (
    "vllm:mm_stage_duration_seconds",
    "Duration of one multimodal pipeline stage (label stage: the mmscope range name, e.g. "
    "mm:hash:pil_image, mm:processor:hf_processor, gpu_model_runner: vit_forward): host wall "
    "time, except the worker's stages on an accelerator, which are device time read from "
    "events.")
STAGE_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05,
                 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
HOOK_OFF = (
    "vllm:mmscope_hook_off",
    "1 while the mmscope hook named (label hook; feature, process: what it observes and where) "
    "has turned itself off after an error of its own, 0 otherwise. The figures it fed are "
    "withdrawn from /metrics on that engine (feature accounting: every vllm:encoder_cache_* "
    "series; ranges: vllm:mm_stage_duration_seconds, vllm:ec_connector_transfer_* and "
    "vllm:mm_media_*; "
    "ttft_parts: the TTFT split), never left to read as zeros.")

ENGINE_LABELS = ["model_name", "engine"]
NS_KINDS = (transfers.NS, media_loads.CACHED_NS)  # counted in ns, exposed in seconds


class MetricClasses(NamedTuple):
    """The metric classes of the logger the series sit beside (prometheus_client's, or the
    wrappers vLLM's Ray logger uses instead)."""

    counter: type
    gauge: type
    histogram: type


class EncoderCacheProm:
    """mmscope's series on vLLM's /metrics. Every series exists at 0 from the start (each source,
    each modality the model accepts, each stage timed, each engine, each transfer direction where
    an EC connector is configured) and the capacity gauge holds its value, so that rate() and
    increase() see the first events (docs/design.md §9). Each series' child is resolved once:
    labels() takes a lock and hashes the values on every call."""

    def __init__(self, classes: MetricClasses, per_engine_labelvalues: dict[int, list],
                 modalities=(), capacity_embeds: int | None = None, ec_connector: bool = False,
                 bytes_per_embed: int | None = None, hooks: tuple[tuple[str, str, str], ...] = (),
                 listed: tuple[str, ...] | None = None):
        """`hooks`: every hook that may turn off, as (name, feature, process); `listed`: those
        whose series exist from the start (all where None): a row of a model runner no worker
        here uses never fires."""
        self.labelvalues = per_engine_labelvalues
        self.bytes_per_embed = bytes_per_embed
        self.hooks = {name: (feature, process) for name, feature, process in hooks}
        self.listed = tuple(self.hooks) if listed is None else listed
        # What a hook turned off fed, by engine: no longer observed, its series removed.
        self._withdrawn: dict[str, set[int]] = {Feature.ACCOUNTING: set(), Feature.RANGES: set()}
        # (engine, wire key) -> the child's inc, set or observe
        self._updates: dict[tuple[int, str], object] = {}
        self._stage_observers: dict[tuple[int, str], object] = {}
        self._transfers: dict[tuple[int, str], object] = {}
        self._media_incs: dict[tuple[int, str], object] = {}
        counters = {k: _metric(classes.counter, n, d) for k, (n, d) in COUNTERS.items()}
        self._labeled = {k: _metric(classes.counter, n, d, [extra])
                         for k, (n, extra, d) in LABELED.items()}
        gauges = {k: _metric(classes.gauge, n, d, multiprocess_mode="mostrecent")
                  for k, (n, d) in GAUGES.items() if bytes_per_embed or k not in BYTES_OF.values()}
        self.stage_seconds = _metric(classes.histogram, *STAGE_HISTOGRAM, ["stage"],
                                     buckets=STAGE_BUCKETS)
        self._transfer_metrics = {k: _metric(classes.counter, n, d, ["direction"])
                                  for k, (n, d) in TRANSFER_COUNTERS.items()} if ec_connector else {}
        self._media = {k: _metric(classes.counter, n, d, extra)
                       for k, (n, extra, d) in MEDIA.items()} if modalities else {}
        self.hook_off_gauge = _metric(classes.gauge, *HOOK_OFF, ["hook", "feature", "process"],
                                      multiprocess_mode="mostrecent")
        self._counts = [*counters.values(), *self._labeled.values(), *gauges.values()]
        for idx, values in per_engine_labelvalues.items():
            for key, metric in counters.items():
                self._updates[(idx, key)] = metric.labels(*values).inc
            for key, metric in gauges.items():
                self._updates[(idx, key)] = metric.labels(*values).set
            self._start_engine(idx, modalities, capacity_embeds)

    def _start_engine(self, idx: int, modalities, capacity_embeds: int | None) -> None:
        """The engine's labelled series at 0 and its capacity set."""
        values = self.labelvalues[idx]
        for name in self.listed:
            self.hook_off_gauge.labels(*values, name, *self.hooks[name]).set(0)
        for source in HIT_SOURCES:
            for kind in ("hits_by_source", "hit_embeds_by_source"):
                self._update(idx, counts.key(kind, source))
        for modality in modalities:
            for kind in ("queries_by_modality", "hits_by_modality", "prefix_covered_by_modality",
                         "query_embeds_by_modality", "hit_embeds_by_modality"):
                self._update(idx, counts.key(kind, modality))
        for kind, metric in self._transfer_metrics.items():
            for direction in transfers.DIRECTIONS:
                self._transfers[(idx, counts.key(kind, direction))] = metric.labels(
                    *values, direction).inc
        if capacity_embeds is not None:
            self._set_gauge(idx, "capacity_embeds", capacity_embeds)
        if modalities:  # a multimodal model: every stage's histogram from the start too
            for stage in stages.TIMED_STAGES + stages.media_stages(modalities):
                self._stage_observer(idx, stage)
            for wire_key in media_keys(modalities):
                self._media_inc(idx, wire_key)

    # --- the encoder cache's counts -------------------------------------------------------------
    def observe(self, wire: dict[str, int], engine_idx: int) -> None:
        if engine_idx not in self.labelvalues or engine_idx in self._withdrawn[Feature.ACCOUNTING]:
            return
        for wire_key, n in wire.items():
            if wire_key in BYTES_OF:
                self._set_gauge(engine_idx, wire_key, n)
                continue
            update = self._update(engine_idx, wire_key)
            if update is not None and n:
                update(n)

    def _update(self, engine_idx: int, wire_key: str):
        """The inc or set a wire key stands for, or None for a key with no series of its own
        (`requests`, which only the log line's window uses)."""
        found = self._updates.get((engine_idx, wire_key), False)
        if found is False:
            kind, labels = counts.split(wire_key)
            metric = self._labeled.get(kind) if labels else None
            found = metric.labels(*self.labelvalues[engine_idx], *labels).inc if metric else None
            self._updates[(engine_idx, wire_key)] = found
        return found

    def _set_gauge(self, engine_idx: int, key: str, embeds: int) -> None:
        """An occupancy gauge in embeddings, and in bytes where the outputs' width is known."""
        self._updates[(engine_idx, key)](embeds)
        if self.bytes_per_embed:
            self._updates[(engine_idx, BYTES_OF[key])](embeds * self.bytes_per_embed)

    # --- stages, transfers and media --------------------------------------------------------
    def observe_stages(self, durations: dict[str, list[int]], engine_idx: int) -> None:
        if engine_idx not in self.labelvalues or engine_idx in self._withdrawn[Feature.RANGES]:
            return
        for stage, values in durations.items():
            observe = self._stage_observer(engine_idx, stage)
            for ns in values:
                observe(ns / 1e9)

    def _stage_observer(self, engine_idx: int, stage: str):
        """The observe method of the stage's child (the API server's stages are drained every
        step)."""
        found = self._stage_observers.get((engine_idx, stage))
        if found is None:
            found = self._stage_observers[(engine_idx, stage)] = self.stage_seconds.labels(
                *self.labelvalues[engine_idx], stage).observe
        return found

    def observe_transfers(self, wire: dict[str, int], engine_idx: int) -> None:
        if engine_idx in self._withdrawn[Feature.RANGES]:
            return
        for wire_key, n in wire.items():
            inc = self._transfers.get((engine_idx, wire_key))
            if inc is not None and n:
                inc(_exposed(wire_key, n))

    def observe_media(self, wire: dict[str, int], engine_idx: int) -> None:
        if (engine_idx not in self.labelvalues or engine_idx in self._withdrawn[Feature.RANGES]
                or not self._media):
            return
        for wire_key, n in wire.items():
            if n:
                self._media_inc(engine_idx, wire_key)(_exposed(wire_key, n))

    def _media_inc(self, engine_idx: int, wire_key: str):
        inc = self._media_incs.get((engine_idx, wire_key))
        if inc is None:
            kind, labels = counts.split(wire_key)
            inc = self._media_incs[(engine_idx, wire_key)] = self._media[kind].labels(
                *self.labelvalues[engine_idx], *labels).inc
        return inc

    # --- hooks turned off -------------------------------------------------------------------
    def hook_off(self, name: str, engine_idx: int | None) -> None:
        """Hook `name` turned itself off in engine `engine_idx`'s processes (None: in this process,
        which every engine's figures pass through): say so, and withdraw what it fed."""
        if name not in self.hooks:
            return
        feature, process = self.hooks[name]
        for idx in self.labelvalues if engine_idx is None else [engine_idx]:
            values = self.labelvalues.get(idx)
            if values is None:
                continue
            self.hook_off_gauge.labels(*values, name, feature, process).set(1)
            fed = self._fed(feature)
            if fed and idx not in self._withdrawn[feature]:
                self._withdrawn[feature].add(idx)
                engine = dict(zip(ENGINE_LABELS, values))
                for metric in fed:
                    metric.remove_by_labels(engine)
                if feature == Feature.ACCOUNTING:
                    self._updates = {k: v for k, v in self._updates.items() if k[0] != idx}

    def _fed(self, feature: str) -> list:
        """The series a hook of `feature` feeds (docs/design.md §9: withdrawn once it is off)."""
        if feature == Feature.ACCOUNTING:
            return self._counts
        if feature == Feature.RANGES:
            return [self.stage_seconds, *self._transfer_metrics.values(), *self._media.values()]
        return []


def _metric(cls, name: str, documentation: str, extra=(), **options):
    """One series family beside vLLM's, labelled by model and engine (and `extra`)."""
    return cls(name=name, documentation=documentation, labelnames=ENGINE_LABELS + list(extra),
               **options)


def _exposed(wire_key: str, n: int) -> float:
    """A count as its series shows it: nanoseconds as seconds."""
    return n / 1e9 if counts.split(wire_key)[0] in NS_KINDS else n


def media_keys(modalities) -> list[str]:
    """The media series a model accepting `modalities` has from the start, as wire keys."""
    pairs = [(s, m) for s in stages.MEDIA_SOURCES for m in modalities
             if m in stages.MEDIA_MODALITIES]
    kinds = (media_loads.BYTES, media_loads.CACHED, media_loads.CACHED_NS)
    return [counts.key(kind, *pair) for kind in kinds for pair in pairs] + [
        counts.key(media_loads.FAILED, step, *pair) for pair in pairs
        for step in (stages.MEDIA_FETCH, stages.MEDIA_DECODE)]
