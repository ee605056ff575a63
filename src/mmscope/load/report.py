"""What a sweep shows: per-level numbers as JSON, a terminal table with the verdicts, and a plot
of hit rate and time to first token against reuse.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from mmscope import stages
from mmscope.expose import layers
from mmscope.load import epd, media_urls
from mmscope.load.observed import series, ttft_parts
from mmscope.load.fleet import Shard
from mmscope.load.observed.readings import ONE_PAGE
from mmscope.load.sweep import LevelResult
from mmscope.load.verdict import SPARED, compared, observed
from mmscope.vocabulary import EncoderWay, ProcessorWay


MAIN_TITLE = "encoder cache per reuse level"
CACHE_TITLE = "hits by source, capacity, and vLLM's other caches"
TTFT_TITLE = ("time to first token by part, server side, p50 / p90 ms (mean in --json); "
              "hit: the encoder ran for none of the request's items")
LAYERS_TITLE = ("where items were served from (vllm:mm_items_total), observed (planned), and the "
                "work the caches saved (vllm:mm_work_saved_seconds_total)")
MEDIA_TITLE = ("media by source: the server's fetch and decode (mean ms per item), bytes, fetches "
               "its processor cache made pointless, against the TTFT of the requests sent that way")
INSTANCES_TITLE = ("each instance's share: requests and time to first token (vLLM's, p50 / p90 "
                   "ms), encoder-cache counts")
TTFT_OFF = ("time to first token by part: the server splits none "
            "(start it with MMSCOPE_TTFT_PARTS=1 in its environment)")


@dataclass(frozen=True)
class RunInfo:
    urls: tuple[str, ...]
    model: str
    seed: int
    requests: int
    images_per_request: int
    concurrency: int
    image_size: tuple[int, int]
    embeds_per_image: int | None
    prefix: bool = False  # the prefix plan (whole requests repeated, images first)
    media: media_urls.MediaOptions = media_urls.MediaOptions()
    image_format: str = "png"
    shard: Shard = Shard(0)
    lanes: int = 1
    counters: str = ONE_PAGE


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 2)


def _rate(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def ttft_ms(level: LevelResult) -> dict[str, float | None]:
    groups = {"repeat": [r.timing.ttft_s for r in level.results if r.request.all_repeats],
              "new": [r.timing.ttft_s for r in level.results if not r.request.all_repeats]}
    return {f"{name}_p{q}": _ms(percentile(values, q))
            for name, values in groups.items() for q in (50, 90)}


def embeddings(level: LevelResult) -> dict:
    """The same outcomes weighed by embeddings, the unit of the encoder's work: the hit rate,
    and the work saved by hits and the prefix cache together."""
    queried, hit = level.count(series.QUERY_EMBEDS), level.count(series.HIT_EMBEDS)
    covered = level.count(series.PREFIX_COVERED_EMBEDS)
    return {"observed_query_embeds": queried, "observed_hit_embeds": hit,
            "observed_prefix_covered_embeds": covered,
            "observed_embed_hit_rate": _rate(hit, queried),
            "observed_saved_embed_rate": _rate(hit + covered, queried + covered)}


def media_json(level: LevelResult) -> dict:
    """Per source: the level's requests sent that way and their client TTFT, and what the server
    counted of their items; the http fetches planned against those answered and counted."""
    out = {}
    for source, s in sorted(media_urls.by_source(level.delta).items()):
        ttfts = [r.timing.ttft_s for r in level.results if r.source == source]
        out[source] = {
            "requests": len(ttfts), "items": int(round(s["fetch_count"])),
            "fetch_ms": {"mean": _ms(_mean(s["fetch_sum"], s["fetch_count"])),
                         "total": _ms(s["fetch_sum"])},
            "decode_ms": {"mean": _ms(_mean(s["decode_sum"], s["decode_count"])),
                          "total": _ms(s["decode_sum"])},
            "bytes": int(round(s["bytes"])), "failed": int(round(s["failed"])),
            "redundant_fetches": int(round(s["redundant"])),
            "redundant_ms": _ms(s["redundant_s"]),
            "ttft_ms": {f"p{q}": _ms(percentile(ttfts, q)) for q in (50, 90)}}
    f = level.fetches
    return {"by_source": out,
            "fetches": None if f is None else {
                "planned": f.planned, "planned_bytes": f.planned_bytes, "served": f.served,
                "served_bytes": f.served_bytes, "counted": f.counted,
                "counted_bytes": f.counted_bytes}}


def _mean(total: float, count: float) -> float | None:
    return total / count if count else None


def instances_json(level: LevelResult) -> dict:
    """Each instance's share of the level: its requests (as vLLM counts them) and their time to
    first token, its planned hits where the client chose it, its encoder-cache counts."""
    spread = level.spread or {}
    out = {}
    for instance, delta in level.deltas.items():
        counts = {name: int(round(delta.get(key, 0.0))) for name, key in series.SHARES}
        requests = delta.get(f"{series.VLLM_TTFT}_count")
        part = spread.get(instance)
        out[instance] = {
            "requests": None if requests is None else int(round(requests)),
            "planned_hits": None if part is None else part.planned_hits,
            **counts, "hit_rate": _rate(counts["hits"], counts["queries"]),
            "capacity_embeds": level.capacities.get(instance),
            "ttft_ms": ttft_parts.summary(delta, series.VLLM_TTFT)}
    return out


def level_json(level: LevelResult) -> dict:
    plan, seen, verdict = level.plan, level.observed, level.verdict
    e2e = [r.timing.e2e_s for r in level.results]
    routed = level.routed
    return {
        "reuse": plan.reuse, "requests": len(plan.requests), "images": plan.images,
        "distinct_images": plan.distinct, "planned_hits": plan.planned_hits,
        "planned_hit_rate": _rate(plan.planned_hits, plan.images),
        "observed_queries": seen.queries, "observed_hits": seen.hits,
        "observed_misses": level.count(series.MISSES),
        "observed_hit_rate": _rate(seen.hits, seen.queries),
        "observed_prefix_covered": seen.prefix_covered,
        # encoder work avoided per item sent: hits and prefix-covered items alike
        "observed_avoided_rate": _rate(seen.avoided, plan.images),
        **embeddings(level),
        "hits_by_source": {s: level.count(series.by_source(s)) for s in series.HIT_SOURCES},
        "deferrals": level.count(series.DEFERRALS), "evictions": seen.evictions,
        "capacity_embeds": level.capacity_embeds, "embeds_per_image": level.embeds_per_image,
        "capacity_allows_hits": level.capacity_allows,
        **{cache: {"queries": level.count(series.cache_queries(cache)),
                   "hits": level.count(series.cache_hits(cache))}
           for cache in series.OTHER_CACHES},
        "repeat_requests": sum(r.all_repeats for r in plan.requests),
        "ttft_ms": ttft_ms(level),
        "ttft_parts": ttft_parts.split(level.delta, [r.timing.ttft_s for r in level.results]),
        "media": media_json(level),
        "e2e_ms": {f"p{q}": _ms(percentile(e2e, q)) for q in (50, 90)},
        "wall_s": round(level.wall_s, 3),
        "throughput_rps": round(len(level.results) / level.wall_s, 3) if level.wall_s else None,
        "build_s": round(level.build_s, 3),
        "instances": instances_json(level),
        "router": None if routed is None else routed.json(),
        "layers": None if (seen := observed(level.delta)) is None else compared(plan, seen),
        "verdict": {"status": verdict.status, "text": verdict.text},
        **({"pd_instance": {**pd, "layers": observed(level.delta, epd.PD)}}
           if (pd := epd.pd_counts(level.delta)) is not None else {}),
    }


def run_json(info: RunInfo, levels: list[LevelResult]) -> dict:
    return {"urls": list(info.urls), "model": info.model, "seed": info.seed,
            "shard": {"part": info.shard.index + 1, "of": info.shard.count, "lanes": info.lanes},
            "counters": info.counters,
            "requests_per_level": info.requests, "images_per_request": info.images_per_request,
            "concurrency": info.concurrency, "image_size": list(info.image_size),
            "embeds_per_image": info.embeds_per_image, "prefix_plan": info.prefix,
            "media": {"sources": list(info.media.sources), "format": info.image_format,
                      "latency_ms": _ms(info.media.latency_s),
                      "jitter_ms": _ms(info.media.jitter_s), "vary_urls": info.media.vary_urls},
            "ok": all(level.verdict.ok for level in levels),
            "levels": [level_json(level) for level in levels]}


def header(info: RunInfo, levels: list[LevelResult]) -> str:
    width, height = info.image_size
    capacity = next((lv.capacity_embeds for lv in levels if lv.capacity_embeds), None)
    embeds = f"{info.embeds_per_image} embeds" if info.embeds_per_image else "unknown embeds"
    cache = f"{capacity} embeds" if capacity else "unknown"
    return (f"mmscope load: {', '.join(info.urls)}, model {info.model}, seed {info.seed}\n"
            f"per level: {_count(info.requests, 'request')} of "
            f"{_count(info.images_per_request, 'image')}, concurrency {info.concurrency}; "
            f"{width}x{height} {info.image_format} images ({embeds} each); encoder cache {cache}"
            f"\nimages sent as {_media_line(info.media)}" + _fleet_line(info, levels))


def _fleet_line(info: RunInfo, levels: list[LevelResult]) -> str:
    """Where a run of several instances or shards sent its requests and read its counters."""
    if len(info.urls) == 1 and info.shard.count == 1 and info.counters == ONE_PAGE:
        return ""
    parts = []
    if info.shard.count > 1:
        sent = len(levels[0].plan.requests) if levels else 0
        parts.append(f"shard {info.shard.index + 1} of {info.shard.count} ({sent} of each "
                     f"level's {info.requests} requests, {info.lanes} lanes in all)")
    if len(info.urls) > 1:
        parts.append(f"the plan spread over {len(info.urls)} URLs, each image to one")
    return "\n" + "; ".join([*parts, f"counters from {info.counters}"])


def _media_line(options: media_urls.MediaOptions) -> str:
    sent = " and ".join(options.sources) + (" (requests take turns)"
                                            if len(options.sources) > 1 else "")
    if not options.http:
        return sent
    vary = ", a new URL per request" if options.vary_urls else ""
    return (f"{sent}; media server on loopback answering in {options.latency_s * 1000:g} ms "
            f"+/- {options.jitter_s * 1000:g} ms{vary}")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def print_terminal(info: RunInfo, levels: list[LevelResult], console=None) -> None:
    from mmscope.console import report_console

    console = console or report_console()
    rows = [level_json(lv) for lv in levels]
    console.print(header(info, levels), highlight=False)
    tables = [(MAIN_TITLE, _main_table(rows)), (CACHE_TITLE, _cache_table(rows))]
    if any(r["layers"] for r in rows):
        tables.append((LAYERS_TITLE, _layers_table(rows)))
    if any(r["ttft_parts"][o]["requests"] for r in rows for o in ttft_parts.OUTCOMES):
        tables.append((TTFT_TITLE, _ttft_table(rows)))
    if any(r["media"]["by_source"] for r in rows):
        tables.append((MEDIA_TITLE, _media_table(rows)))
    if any(len(r["instances"]) > 1 for r in rows):
        tables.append((INSTANCES_TITLE, _instances_table(rows)))
    for title, table in tables:
        console.print(title, highlight=False)
        console.print(table)
    if not any(key.startswith(series.TTFT_MM) for level in levels for key in level.delta):
        console.print(TTFT_OFF, highlight=False)
    for level in levels:
        style = "" if level.verdict.ok else "bold red"
        console.print(f"reuse {level.plan.reuse:g}: {level.verdict.text}", style=style,
                      highlight=False)


def _num(value, fmt: str = "{:g}") -> str:
    return "-" if value is None else fmt.format(value)


def _percent(rate: float | None) -> str:
    return _num(rate, "{:.0%}")


def _pair(a, b, fmt: str = "{:.1f}") -> str:
    return f"{_num(a, fmt)} / {_num(b, fmt)}"


def _main_table(rows: list[dict]):
    from rich.table import Table

    table = Table()
    for name in ("reuse", "requests", "images", "planned hits", "queries", "hits",
                 "prefix covered", "hit rate (plan)", "embeds hit", "avoided",
                 "embeds saved", "TTFT repeat p50/p90 ms",
                 "TTFT new p50/p90 ms", "req/s"):
        table.add_column(name, justify="right")
    for r in rows:
        t = r["ttft_ms"]
        table.add_row(f"{r['reuse']:g}", str(r["requests"]), str(r["images"]),
                      str(r["planned_hits"]), str(r["observed_queries"]), str(r["observed_hits"]),
                      str(r["observed_prefix_covered"]),
                      f"{_percent(r['observed_hit_rate'])} ({_percent(r['planned_hit_rate'])})",
                      _percent(r["observed_embed_hit_rate"]), _percent(r["observed_avoided_rate"]),
                      _percent(r["observed_saved_embed_rate"]),
                      _pair(t["repeat_p50"], t["repeat_p90"]), _pair(t["new_p50"], t["new_p90"]),
                      _num(r["throughput_rps"], "{:.2f}"))
    return table


def _cache_table(rows: list[dict]):
    from rich.table import Table

    table = Table()
    for name in ("reuse", *series.HIT_SOURCES, "deferrals", "evictions", "capacity allows",
                 "mm_cache hits/queries", "prefix_cache hits/queries (tokens)"):
        table.add_column(name, justify="right")
    for r in rows:
        table.add_row(f"{r['reuse']:g}", *(str(r["hits_by_source"][s]) for s in series.HIT_SOURCES),
                      str(r["deferrals"]), str(r["evictions"]), _num(r["capacity_allows_hits"]),
                      *(f"{r[c]['hits']} / {r[c]['queries']}" for c in series.OTHER_CACHES))
    return table


def _layers_table(rows: list[dict]):
    from rich.table import Table

    table = Table()
    for name in ("reuse", *LAYER_COLUMNS):
        table.add_column(name, justify="right")
    for r in rows:
        if r["layers"]:
            table.add_row(f"{r['reuse']:g}", *_layer_cells(r["layers"]))
    return table


def _layer_cells(side: dict) -> list[str]:
    """A level's row of the layers table: observed (planned) where the plan says."""
    plan, seen = side["planned"], side["observed"]
    processor = [f"{seen['processor'][w]} ({plan['processor'][w]})" for w in
                 (ProcessorWay.HIT, ProcessorWay.MISS, ProcessorWay.OFF)]
    encoder = [str(seen["encoder"][w]) for w in SPARED]
    saved = sum(seen["saved_s"].values())
    return [*processor, *encoder, f"{seen['spared']} ({plan['spared']})",
            f"{seen['encoder'][EncoderWay.COMPUTED]} ({plan['computed']})", f"{saved:.3f}"]


LAYER_COLUMNS = ("processor hit", "processor miss", "processor off",
                 *(layers.SERVED_BY[w] for w in SPARED), "spared", "computed", "work saved s")


def _ttft_table(rows: list[dict]):
    """One row per level and outcome: the server's TTFT and its parts; the last column is the
    mean time the client waited beyond the server's TTFT (the way in and out)."""
    from rich.table import Table

    table = Table()
    for name in ("reuse", "encoder cache", "requests", "TTFT", *stages.TTFT_PARTS,
                 "client beyond (mean)"):
        table.add_column(name, justify="right")
    for r in rows:
        split = r["ttft_parts"]
        for outcome in ttft_parts.OUTCOMES:
            o = split[outcome]
            if not o["requests"]:
                continue
            cells = [o["ttft"]] + [o["parts"][p] for p in stages.TTFT_PARTS]
            table.add_row(f"{r['reuse']:g}", outcome, str(o["requests"]),
                          *(_pair(c["p50_ms"], c["p90_ms"]) for c in cells),
                          _num(split["client_beyond_server_mean_ms"], "{:.1f}"))
    return table


def _media_table(rows: list[dict]):
    from rich.table import Table

    table = Table()
    for name in ("reuse", "source", "requests", "items", "fetch ms", "decode ms", "KiB fetched",
                 "fetched though cached", "failed", "TTFT p50/p90 ms"):
        table.add_column(name, justify="right")
    for r in rows:
        for source, m in r["media"]["by_source"].items():
            table.add_row(f"{r['reuse']:g}", source, str(m["requests"]), str(m["items"]),
                          _num(m["fetch_ms"]["mean"], "{:.1f}"),
                          _num(m["decode_ms"]["mean"], "{:.1f}"), f"{m['bytes'] / 1024:.1f}",
                          f"{m['redundant_fetches']} ({_num(m['redundant_ms'], '{:.0f}')} ms)"
                          if m["redundant_fetches"] else "0",
                          str(m["failed"]), _pair(m["ttft_ms"]["p50"], m["ttft_ms"]["p90"]))
    return table


def _instances_table(rows: list[dict]):
    from rich.table import Table

    table = Table()
    for name in ("reuse", "instance", "requests", "TTFT p50/p90 ms", "planned hits",
                 *(name for name, _ in series.SHARES), "hit rate"):
        table.add_column(name, justify="right")
    for r in rows:
        for instance, share in r["instances"].items():
            t = share["ttft_ms"]
            table.add_row(f"{r['reuse']:g}", instance, _num(share["requests"]),
                          _pair(t["p50_ms"], t["p90_ms"]), _num(share["planned_hits"]),
                          *(str(share[name]) for name, _ in series.SHARES),
                          _percent(share["hit_rate"]))
    return table


def write_plot(path: str, levels: list[LevelResult]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [level_json(lv) for lv in levels]
    reuse = [r["reuse"] for r in rows]
    fig, (hits, ttft) = plt.subplots(1, 2, figsize=(10, 4))
    hits.plot(reuse, [_nan(r["planned_hit_rate"]) for r in rows], "--", label="planned")
    hits.plot(reuse, [_nan(r["observed_hit_rate"]) for r in rows], "o-", label="observed")
    if all(r["capacity_allows_hits"] is not None for r in rows):
        hits.plot(reuse, [_nan(_rate(r["capacity_allows_hits"], r["images"])) for r in rows], ":",
                  label="capacity allows")
    hits.set(xlabel="reuse", ylabel="encoder cache hit rate", ylim=(0, 1.05))
    hits.legend()
    for group, marker, color in (("repeat", "o", "C0"), ("new", "s", "C1")):
        for q, line in (("p50", "-"), ("p90", ":")):
            ttft.plot(reuse, [_nan(r["ttft_ms"][f"{group}_{q}"]) for r in rows], marker + line,
                      color=color, label=f"{group} {q}")
    ttft.set(xlabel="reuse", ylabel="time to first token (ms)")
    ttft.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _nan(value: float | None) -> float:
    return math.nan if value is None else value
