"""Read vLLM's counters back: from `LLM.get_metrics()` or from a `/metrics` page, as flat dicts.

Keys drop the `vllm:` prefix and `_total` suffix and sum over engines: `encoder_cache_hits`,
`encoder_cache_hits_by_source{source=local}`.
"""
from __future__ import annotations

from collections import defaultdict

ENGINE_LABELS = ("model_name", "engine")


def series_key(name: str, labels: dict[str, str]) -> str:
    base = name.removeprefix("vllm:")
    base = base[: -len("_total")] if base.endswith("_total") else base
    extra = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in ENGINE_LABELS)
    return f"{base}{{{extra}}}" if extra else base


def from_vllm_metrics(metrics, prefix: str = "") -> dict[str, float]:
    """Counters and gauges of `LLM.get_metrics()` (histograms are left out)."""
    out: dict[str, float] = defaultdict(float)
    for m in metrics:
        value = getattr(m, "value", None)
        if value is None or not m.name.startswith("vllm:" + prefix):
            continue
        out[series_key(m.name, dict(m.labels))] += value
    return dict(out)


def from_prometheus_text(text: str, prefix: str = "",
                         histograms: tuple[str, ...] = ()) -> dict[str, float]:
    """Counter and gauge samples of a Prometheus exposition page, and the `_bucket`, `_sum` and
    `_count` samples of the histograms named (as keys: `request_ttft_part_seconds`)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = defaultdict(float)
    wanted = {"vllm:" + name for name in histograms}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("vllm:" + prefix) or not (
                family.type in ("counter", "gauge")
                or (family.type == "histogram" and family.name in wanted)):
            continue
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            out[series_key(sample.name, sample.labels)] += sample.value
    return dict(out)


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in set(before) | set(after)}


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus' histogram_quantile over cumulative bucket counts (upper bound -> count):
    linear inside the bucket that holds the rank; the highest finite bound where it is +Inf."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * ((rank - below) / (count - below) if count > below
                                              else 0.0)
        lower, below = bound, count
    return lower
