"""The Prometheus series of multimodal requests' time to first token, split by part and by whether
the encoder ran for the request (`encoder_cache="miss"`) or for none of its items (`"hit"`).

Names beside vLLM's `vllm:time_to_first_token_seconds` and `vllm:request_*_time_seconds`.
"""
from __future__ import annotations

from mmscope import stages
from mmscope.carry.ttft_split import TtftSplit

PART_HISTOGRAM = (
    "vllm:request_ttft_part_seconds",
    "Time to first token of multimodal requests, by part (media: the request's items fetched and "
    "decoded, wall time; processor: the multimodal processor; render: the rest of the API "
    "server's processing, chat template and tokens; the three add up to vLLM's arrival until "
    "the request leaves the API server; queue; encoder: "
    "the request's share of the encoder steps that computed its items; ec_load: its share of EC "
    "connector loads; prefill: the rest until the first token; other: what is not attributed). "
    "The parts of a request add up to its time to first token.")
TTFT_HISTOGRAM = (
    "vllm:request_mm_time_to_first_token_seconds",
    "Time to first token of multimodal requests (vLLM's own measure), by encoder_cache: miss when "
    "the encoder ran for any of the request's items, hit when it ran for none.")
OUTCOMES = ("hit", "miss")
# 0 first: a part that was 0 (a hit's encoder share, no connector) reads 0 in every quantile.
# prometheus_client's observe() walks the bounds: few below the milliseconds most parts take.
BUCKETS = (0.0, 5e-4, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
           1.5, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)


class TtftProm:
    """Both histograms, every (engine, part, outcome) child at 0 from the start."""

    def __init__(self, histogram_cls, per_engine_labelvalues: dict[int, list]):
        labels = ["model_name", "engine"]
        self.labelvalues = per_engine_labelvalues
        self.parts = parts = histogram_cls(name=PART_HISTOGRAM[0], documentation=PART_HISTOGRAM[1],
                              labelnames=labels + ["part", "encoder_cache"], buckets=BUCKETS)
        self.total = total = histogram_cls(name=TTFT_HISTOGRAM[0], documentation=TTFT_HISTOGRAM[1],
                              labelnames=labels + ["encoder_cache"], buckets=BUCKETS)
        # (engine, hit) -> the children's observe methods, the TTFT's first, then the parts' in
        # stages.TTFT_PARTS order: resolved once (labels() locks and hashes), made at 0.
        self._observers = {
            (idx, outcome == "hit"): (total.labels(*values, outcome).observe,
                                      tuple(parts.labels(*values, p, outcome).observe
                                            for p in stages.TTFT_PARTS))
            for idx, values in per_engine_labelvalues.items() for outcome in OUTCOMES}

    def observe(self, split: TtftSplit) -> None:
        observers = self._observers.get((split.engine, split.hit))
        if observers is None:
            return
        total, parts = observers
        total(split.ttft_s)
        for observe, seconds in zip(parts, split.parts.values()):
            observe(seconds if seconds > 0 else 0.0)

    def withdraw(self, engine_idx: int | None) -> None:
        """A hook the split needs turned itself off: the engine's split is no longer observed and
        its series are removed, never left to read as zeros (None: every engine)."""
        for idx, values in self.labelvalues.items():
            if engine_idx in (None, idx):
                engine = dict(zip(("model_name", "engine"), values))
                for metric in (self.parts, self.total):
                    metric.remove_by_labels(engine)
                for outcome in OUTCOMES:
                    self._observers.pop((idx, outcome == "hit"), None)
