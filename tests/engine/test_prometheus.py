"""The Grafana dashboard against a real Prometheus scraping a real vLLM server every second: every
panel's expression, template variables filled in, equals the truth of a scripted workload.

Window A runs from the engine's start, so a series that appears only at its first non-zero value
makes `rate()` miss that value and its panel read wrong. Windows B and C follow, once every stage
series exists, and check the stage histograms against the server's own bucket counts too; C
fills the encoder cache past its capacity.
"""
from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mmscope import stages
from tests.kit.prometheus import JOB, Prometheus, check_metrics
from tests.kit.server import chat, metrics, png

pytestmark = pytest.mark.vllm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DASHBOARD = os.path.join(ROOT, "dashboards", "mmscope.json")
EMBEDS_PER_IMAGE = 16  # the tiny LLaVA's 32x32 image in 8x8 patches
CAPACITY = 512  # vLLM sizes the encoder cache to the step's token budget, set below: 32 images
LONG_TEXT = "Describe the picture in detail, " * 40  # over a full KV block after the image
OURS = re.compile(r"^vllm:(encoder_cache_|mm_stage_|mm_media_|mm_item|mm_work_saved_|mm_encoder_)")
PROBE = "vllm:encoder_cache_queries_total"


@dataclass
class Truth:
    """What a window's workload did, counted by the script that sent it."""

    queries: int
    hits: int
    misses: int
    by_source: dict[str, int]
    prefix_covered: int
    mm_queries: int  # vLLM's processor cache, which sees every item sent
    mm_hits: int
    usage_embeds: int
    refetched: int  # items sent again whose content the processor cache held at their lookup
    deferrals: int = 0
    evictions: int = 0


# Window A, from the engine's start: new images, their repeats, two copies of one image in one
# request, and a long prompt sent twice (the second time the prefix cache spares its image).
WINDOW_A = [([11], "What is this?"), ([12], "What is this?"), ([13], "What is this?"),
            ([14], "What is this?"),
            ([11], "What is this?"), ([12], "What is this?"), ([13], "What is this?"),
            ([14], "What is this?"),
            ([21, 21], "Twice?"), ([11, 22], "Old and new?"),
            ([31], LONG_TEXT), ([31], LONG_TEXT)]
# The processor cache counts the second copy in one request as a hit (mm_hits), yet both copies
# were looked up before either was in it: only the 4 repeats, 11 and the second 31 are refetched.
TRUTH_A = Truth(queries=13, hits=6, misses=7, by_source={"local": 5, "in_step": 1, "connector": 0},
                prefix_covered=1, mm_queries=14, mm_hits=7,
                usage_embeds=7 * EMBEDS_PER_IMAGE, refetched=6)
# Window B: three new images, one at a time (one encoder forward each), and one repeat.
WINDOW_B = [([41], "What is this?"), ([42], "What is this?"), ([43], "What is this?"),
            ([41], "What is this?")]
TRUTH_B = Truth(queries=4, hits=1, misses=3, by_source={"local": 1, "in_step": 0, "connector": 0},
                prefix_covered=0, mm_queries=4, mm_hits=1,
                usage_embeds=10 * EMBEDS_PER_IMAGE, refetched=1)
ENCODER_FORWARDS_B = 3
# Window C: new images past the cache's capacity, one at a time. 160 of 512 embeds are held after
# B, so 22 more fit; each one after that evicts one (16-embed) entry.
WINDOW_C = [([100 + i], "What is this?") for i in range(25)]
TRUTH_C = Truth(queries=25, hits=0, misses=25, by_source={"local": 0, "in_step": 0, "connector": 0},
                prefix_covered=0, mm_queries=25, mm_hits=0, usage_embeds=CAPACITY, evictions=3,
                refetched=0)
ENCODER_STAGE = "gpu_model_runner: vit_forward"
TRANSFER_PANELS = ("EC transfer items / s", "EC transfer bytes / s", "EC transfer seconds per item")


@dataclass
class Window:
    """A stretch of stored samples: the first (`start`) taken before the workload's first request,
    the last (`end`) after /metrics showed all of it; the pages read at both ends."""

    start: float
    end: float
    page_before: str
    page_after: str
    truth: Truth
    workload: list
    values: dict = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def query_args(self) -> tuple[float, str]:
        """(evaluation time, range) taking in exactly the samples from `start` to `end`."""
        at = self.end + 0.001
        return at, f"{round((at - self.start + 0.001) * 1000)}ms"


class Scraped(NamedTuple):
    srv: object
    prom: Prometheus
    a: Window
    b: Window
    c: Window
    capacity_at_start: float | None


def load_dashboard() -> dict:
    with open(DASHBOARD) as f:
        return json.load(f)


def targets(dash: dict):
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            yield panel["title"], t["refId"], t["expr"]


def settled(srv, truth: Truth, before: dict, timeout_s: float = 60) -> str:
    """The /metrics page once it shows the whole workload (the engine sends its counts at most a
    second apart); the counts are compared by the panels, not here."""
    deadline = time.monotonic() + timeout_s
    while True:
        page = httpx.get(srv.url + "/metrics", timeout=30).text
        now = metrics(srv.url)
        done = (now.get("encoder_cache_queries", 0) - before.get("encoder_cache_queries", 0)
                >= truth.queries and now.get("encoder_cache_prefix_covered", 0)
                - before.get("encoder_cache_prefix_covered", 0) >= truth.prefix_covered)
        if done or time.monotonic() > deadline:
            time.sleep(1.5)  # one more update interval: the gauges and histograms come with it
            return httpx.get(srv.url + "/metrics", timeout=30).text
        time.sleep(0.3)


def run_window(srv, prom, workload, truth: Truth) -> Window:
    page_before = httpx.get(srv.url + "/metrics", timeout=30).text
    before = metrics(srv.url)
    start = prom.wait_for_scrape_after(PROBE, time.time())
    for images, text in workload:
        chat(srv.url, srv.model, images, text)
    page_after = settled(srv, truth, before)
    end = prom.wait_for_scrape_after(PROBE, time.time())
    return Window(start, end, page_before, page_after, truth, workload)


@pytest.fixture(scope="module")
def scraped(tiny_model, tmp_path_factory):
    """Windows A, B and C on one fresh server."""
    from mmscope.demo.serve import VllmServer

    base = tmp_path_factory.mktemp("prometheus")
    srv = VllmServer(tiny_model, str(base / "vllm.log"),
                     extra_args=["--max-num-batched-tokens", str(CAPACITY)],
                     env={"VLLM_LOG_STATS_INTERVAL": "1"})
    with srv, Prometheus(f"127.0.0.1:{srv.port}", str(base)) as prom:
        at_start = metrics(srv.url).get("encoder_cache_capacity_embeds")
        a = run_window(srv, prom, WINDOW_A, TRUTH_A)
        b = run_window(srv, prom, WINDOW_B, TRUTH_B)
        c = run_window(srv, prom, WINDOW_C, TRUTH_C)
        yield Scraped(srv, prom, a, b, c, at_start)


def expected_any(title: str, ref: str, w: Window, ids: dict[str, str]) -> dict | None:
    for expected in (expected_counters(title, ref, w, ids), expected_stages(title, ref, w),
                     expected_media(title, ref, w), expected_layers(title, ref, w)):
        if expected is not None:
            return expected
    return expected_ttft(title, ref, w)


def variable_values(prom, dash, fill) -> dict[str, list[str]]:
    """Each query variable's values as Grafana finds them (label_values through the series API),
    the variables before it filled in."""
    found = {}
    for var in dash["templating"]["list"]:
        if var["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"])
        assert m, f"variable {var['name']}: unexpected query {var['query']!r}"
        selector, label = fill(m[1], found), m[2]
        r = httpx.get(prom.url + f"/api/v1/label/{label}/values",
                      params={"match[]": selector}, timeout=30).json()
        found[var["name"]] = r["data"]
    return found


def filler(rate_range: str):
    """Grafana's substitution: a single selected value, regex-escaped in a PromQL string."""
    def fill(expr: str, values: dict[str, list[str]]) -> str:
        for name, vals in values.items():
            escaped = "|".join(re.escape(v).replace("\\", "\\\\") for v in vals)
            expr = expr.replace(f"${name}", escaped)
        expr = expr.replace("$__rate_interval", rate_range)
        # "$1" is label_replace's first group: Grafana leaves what names no variable alone
        assert not re.search(r"\$(?!\d)", expr), f"unfilled variable in {expr}"
        return expr
    return fill


def sample_map(result: list[dict]) -> dict[tuple, float]:
    return {tuple(sorted(s["metric"].items())): float(s["value"][1]) for s in result}


def stage_histograms(page: str, name: str = "vllm:mm_stage_duration_seconds",
                     by=lambda labels: labels["stage"]) -> dict:
    """key -> {"buckets": {le: cumulative count}, "sum": s, "count": n} from a /metrics page,
    summed over the series of each key (`by`: labels -> key; a stage by default)."""
    out: dict = {}
    for family in text_string_to_metric_families(page):
        if family.name != name:
            continue
        for s in family.samples:
            h = out.setdefault(by(s.labels), {"buckets": {}, "sum": 0.0, "count": 0.0})
            if s.name.endswith("_bucket"):
                le = float(s.labels["le"])
                h["buckets"][le] = h["buckets"].get(le, 0.0) + s.value
            elif s.name.endswith("_sum"):
                h["sum"] += s.value
            elif s.name.endswith("_count"):
                h["count"] += s.value
    return out


def histogram_delta(before: dict, after: dict) -> dict[str, dict]:
    empty = {"buckets": {}, "sum": 0.0, "count": 0.0}
    return {stage: {"buckets": {le: n - before.get(stage, empty)["buckets"].get(le, 0.0)
                                for le, n in h["buckets"].items()},
                    "sum": h["sum"] - before.get(stage, empty)["sum"],
                    "count": h["count"] - before.get(stage, empty)["count"]}
            for stage, h in after.items()}


def quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus' histogram_quantile on cumulative bucket counts: linear within the bucket."""
    les = sorted(buckets)
    total = buckets[math.inf]
    if total == 0:
        return math.nan
    rank = q * total
    for i, le in enumerate(les):
        if buckets[le] >= rank:
            if le == math.inf:
                return les[-2]
            lower = les[i - 1] if i else 0.0
            below = buckets[les[i - 1]] if i else 0.0
            return lower + (le - lower) * (rank - below) / (buckets[le] - below)
    return math.nan


def expected_counters(title: str, ref: str, w: Window, ids: dict[str, str]) -> dict | None:
    """The truth of one counter or gauge panel target in window `w`, keyed like `sample_map`."""
    t, per_s = w.truth, 1 / w.seconds
    sent = t.queries + t.prefix_covered
    table = {
        ("Encoder cache hit rate", "A"): {(): t.hits / t.queries},
        ("Encoder work spared per item", "A"): {(): (t.hits + t.prefix_covered) / sent},
        # every image weighs its EMBEDS_PER_IMAGE embeddings
        ("Encoder work spared, in embeddings", "A"):
            {(): EMBEDS_PER_IMAGE * (t.hits + t.prefix_covered) / (EMBEDS_PER_IMAGE * sent)},
        ("Encoder cache occupancy", "A"): {(): t.usage_embeds / CAPACITY},
        ("Encoder cache evictions / s", "A"): {(): t.evictions * per_s},
        ("mmscope hooks off", "A"): {(): 0.0},  # tests/engine/test_failing_hook.py: one off
        ("Hit rate by source", "A"): {(("source", s),): n / t.queries
                                      for s, n in t.by_source.items()},
        ("Hit rate by source", "B"): {(): t.hits / t.queries},
        ("Hit rate by source", "C"): {(): t.mm_hits / t.mm_queries},
        ("Hit rate by modality", "A"): {(("modality", "image"),): t.hits / t.queries},
        ("Lookups / s", "A"): {(): t.queries * per_s},
        ("Lookups / s", "B"): {(): t.hits * per_s},
        ("Lookups / s", "C"): {(): t.misses * per_s},
        ("Lookups / s", "D"): {(): t.prefix_covered * per_s},
        ("Spared by the prefix cache, by modality", "A"):
            {(("modality", "image"),): t.prefix_covered / sent},
        ("Deferrals and evictions / s", "A"): {(): t.deferrals * per_s},
        ("Deferrals and evictions / s", "B"): {(): t.evictions * per_s},
        ("Occupancy by engine", "A"):
            {(("engine", ids["engine"]), ("instance", ids["instance"])): t.usage_embeds / CAPACITY},
        # No EC connector on this server: no transfer series (test_epd.py has them, counted).
        **{(title, "A"): {} for title in TRANSFER_PANELS},
    }
    return table.get((title, ref))


def expected_stages(title: str, ref: str, w: Window) -> dict | None:
    delta = histogram_delta(stage_histograms(w.page_before), stage_histograms(w.page_after))
    m = re.fullmatch(r"Stage p(\d+)", title)
    if m:
        q = int(m[1]) / 100
        return {(("stage", s),): quantile(q, h["buckets"]) for s, h in delta.items()}
    if title == "Stage time / s":
        return {(("stage", s),): h["sum"] / w.seconds for s, h in delta.items()}
    if title == "Stage calls / s":
        return {(("stage", s),): h["count"] / w.seconds for s, h in delta.items()}
    return None


MEDIA_SOURCES = ("http", "data_url", "file")


def sent_bytes(workload) -> int:
    """The images' bytes as the server fetched them: their data URLs' base64 decoded."""
    return sum(len(png(i)) for images, _ in workload for i in images)


def counter_total(page: str, name: str) -> float:
    return sum(s.value for family in text_string_to_metric_families(page)
               for s in family.samples if s.name == name)


def media_means(w: Window, step: str, label: str) -> dict:
    """Mean seconds per item of the window's mm:media:<step> stages, by source or modality."""
    at = {"source": 1, "modality": 2}[label]
    by = (lambda labels: stages.parse_media_range(labels["stage"]) or ("",) * 3)
    delta = ttft_delta(w, "vllm:mm_stage_duration_seconds", by)
    means: dict = {}
    for (got_step, *values), h in delta.items():
        if got_step == step and h["count"]:
            key = (label, values[at - 1])
            total, count = means.get(key, (0.0, 0.0))
            means[key] = (total + h["sum"], count + h["count"])
    return {(key,): total / count for key, (total, count) in means.items()}


def expected_media(title: str, ref: str, w: Window) -> dict | None:
    """The media row: the window's images all sent as data URLs, each fetched (its base64
    decoded) and decoded once; the repeats the processor cache held are refetched."""
    per_s = 1 / w.seconds
    if title == "Fetch time per item, by source":
        return media_means(w, "fetch", "source")
    if title == "Decode time per item, by modality":
        return media_means(w, "decode", "modality")
    if title == "Bytes fetched / s, by source":
        sent = sent_bytes(w.workload)
        return {(("source", s),): (sent if s == "data_url" else 0) * per_s for s in MEDIA_SOURCES}
    if (title, ref) == ("Fetched though cached / s", "A"):
        return {(("source", s),): (w.truth.refetched if s == "data_url" else 0) * per_s
                for s in MEDIA_SOURCES}
    if (title, ref) == ("Fetched though cached / s", "B"):
        name = "vllm:mm_media_redundant_fetch_seconds_total"
        return {(): (counter_total(w.page_after, name) - counter_total(w.page_before, name))
                * per_s}
    if title == "Failed fetches / s, by step":
        return {(("step", "fetch"),): 0.0, (("step", "decode"),): 0.0}
    return None


def labelled_totals(page: str, name: str, label: str) -> dict[str, float]:
    """A counter's samples on a /metrics page, summed by one label."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            if s.name == name:
                out[s.labels[label]] = out.get(s.labels[label], 0.0) + s.value
    return out


def expected_layers(title: str, ref: str, w: Window) -> dict | None:
    """The cache layers' row: each item once by where its embeddings came from and by what the
    processor cache did (the workload's truth), what each layer saved and the encoder's cost per
    embedding (the server's own counters over the window), the items' sizes (its histograms)."""
    t, per_s = w.truth, 1 / w.seconds
    if title == "Items / s, by where their embeddings came from":
        connector = t.by_source["connector"]
        return {(("encoder", way),): n * per_s for way, n in (
            ("computed", t.misses), ("cache_hit", t.hits - connector),
            ("prefix_covered", t.prefix_covered), ("ec_loaded", connector))}
    if title == "Items / s, by processor cache":
        return {(("processor", way),): n * per_s for way, n in (
            ("hit", t.mm_hits), ("miss", t.mm_queries - t.mm_hits), ("off", 0))}
    if title == "Work saved by layer (s / s)":
        name = "vllm:mm_work_saved_seconds_total"
        before, after = (labelled_totals(page, name, "layer")
                         for page in (w.page_before, w.page_after))
        return {(("layer", layer),): (v - before.get(layer, 0.0)) * per_s
                for layer, v in after.items()}
    if title == "Embeddings per item, p50 / p90":
        q = {"A": 0.5, "B": 0.9}[ref]
        delta = ttft_delta(w, "vllm:mm_item_embeddings", lambda labels: labels["modality"])
        return {(("modality", m),): quantile(q, h["buckets"]) for m, h in delta.items()}
    if title == "Bytes per item, by source (mean)":
        delta = ttft_delta(w, "vllm:mm_item_bytes", lambda labels: labels["source"])
        return {(("source", s),): h["sum"] / h["count"] for s, h in delta.items() if h["count"]}
    if title == "Encoder seconds per embedding":
        found = labelled_totals(w.page_after, "vllm:mm_encoder_seconds_per_embedding",
                                "modality")
        return {(("modality", m),): v for m, v in found.items()}
    return None


def ttft_delta(w: Window, name: str, by) -> dict:
    return histogram_delta(stage_histograms(w.page_before, name, by),
                           stage_histograms(w.page_after, name, by))


def expected_ttft(title: str, ref: str, w: Window) -> dict | None:
    """The TTFT row: mean part by outcome, and TTFT quantiles of hits and misses, from the
    server's own histograms over the window (0/0 is NaN in PromQL too)."""
    m = re.fullmatch(r"TTFT by part, (hits|misses) \(mean\)", title)
    if m:
        outcome = {"hits": "hit", "misses": "miss"}[m[1]]
        delta = ttft_delta(w, "vllm:request_ttft_part_seconds",
                           lambda labels: (labels["encoder_cache"], labels["part"]))
        return {(("part", part),): h["sum"] / h["count"] if h["count"] else math.nan
                for (o, part), h in delta.items() if o == outcome}
    if title == "TTFT p50 / p90, hits and misses":
        q = {"A": 0.5, "B": 0.9}[ref]
        delta = ttft_delta(w, "vllm:request_mm_time_to_first_token_seconds",
                           lambda labels: labels["encoder_cache"])
        return {(("encoder_cache", o),): quantile(q, h["buckets"]) for o, h in delta.items()}
    return None


def same(got: float, want: float) -> bool:
    """Equal within the rounding of the rate window's edges (a millisecond over tens of seconds)."""
    if math.isnan(want):
        return math.isnan(got)
    return math.isclose(got, want, rel_tol=2e-3, abs_tol=1e-9)


def evaluate(prom, dash, w: Window, expected) -> list[str]:
    """Every dashboard target with a truth from `expected`: its mismatches, and the targets
    without one."""
    at, rate_range = w.query_args()
    fill = filler(rate_range)
    values = variable_values(prom, dash, fill)
    ids = {k: v[0] for k, v in values.items()}
    wrong = []
    for title, ref, expr in targets(dash):
        want = expected(title, ref, w, ids)
        if want is None:
            w.values[(title, ref)] = None
            continue
        got = sample_map(prom.query(fill(expr, values), at))
        w.values[(title, ref)] = got
        if got.keys() != want.keys() or not all(same(got[k], want[k]) for k in want):
            wrong.append(f"{title} [{ref}]: dashboard {got}, truth {want}")
    return wrong


def test_template_variables_find_the_server(scraped):
    srv, prom = scraped.srv, scraped.prom
    values = variable_values(prom, load_dashboard(), filler("1m"))
    assert values == {"job": [JOB], "model_name": [srv.model],
                      "instance": [f"127.0.0.1:{srv.port}"], "engine": ["0"]}


def test_capacity_is_set_before_the_first_image(scraped):
    assert scraped.capacity_at_start == CAPACITY  # else the occupancy panels read NaN after each start


def expected_from_start(title: str, ref: str, w: Window, ids: dict[str, str]) -> dict | None:
    """Counters, gauges, the TTFT histograms, the media and cache-layer rows: every series of
    theirs exists from the start (the encoder's cost per embedding once it has run)."""
    for expected in (expected_counters(title, ref, w, ids), expected_media(title, ref, w),
                     expected_layers(title, ref, w)):
        if expected is not None:
            return expected
    return expected_ttft(title, ref, w)


def test_counter_and_ttft_panels_equal_the_truth_from_the_engine_start(scraped):
    a = scraped.a
    wrong = evaluate(scraped.prom, load_dashboard(), a, expected_from_start)
    assert not wrong, "\n".join(wrong)
    unchecked = [k for k, v in a.values.items() if v is None and not k[0].startswith("Stage ")]
    assert not unchecked, f"panels without a truth: {unchecked}"


def test_every_panel_equals_the_truth_once_all_series_exist(scraped):
    b = scraped.b
    wrong = evaluate(scraped.prom, load_dashboard(), b, expected_any)
    assert not wrong, "\n".join(wrong)
    assert all(v is not None for v in b.values.values()), b.values
    forwards = b.values[("Stage calls / s", "A")][(("stage", ENCODER_STAGE),)] * b.seconds
    assert round(forwards, 6) == ENCODER_FORWARDS_B


def test_every_panel_equals_the_truth_past_the_capacity(scraped):
    c = scraped.c
    wrong = evaluate(scraped.prom, load_dashboard(), c, expected_any)
    assert not wrong, "\n".join(wrong)
    assert all(v is not None for v in c.values.values()), c.values


def test_each_layer_that_served_an_item_saved_work(scraped):
    """Window A: the processor cache, the encoder cache and the prefix cache served items; no
    EC connector here."""
    saved = {k[0][1]: v for k, v in scraped.a.values[("Work saved by layer (s / s)", "A")].items()}
    assert saved["processor_cache"] > 0 and saved["encoder_cache"] > 0
    assert saved["prefix_cache"] > 0 and saved["ec_connector"] == 0


def test_ttft_counts_each_request_of_a_window_as_a_hit_or_a_miss(scraped):
    """Window B: three new images (misses), then a repeat (a hit)."""
    delta = ttft_delta(scraped.b, "vllm:request_mm_time_to_first_token_seconds",
                       lambda labels: labels["encoder_cache"])
    assert (delta["miss"]["count"], delta["hit"]["count"]) == (3, 1)


def test_promtool_finds_only_the_colon_rule_in_our_series(scraped):
    srv = scraped.srv
    complaints = check_metrics(httpx.get(srv.url + "/metrics", timeout=30).text)
    ours = [c for c in complaints if OURS.match(c)]
    colon = " metric names should not contain ':'"
    assert ours and all(c.endswith(colon) and " " not in c.removesuffix(colon) for c in ours), ours
    # vLLM's own names carry the same remark: the colon is the family's naming, not ours alone.
    assert any(c.startswith("vllm:num_requests_running" + colon) for c in complaints)


def test_dashboard_follows_vllm_conventions():
    dash = load_dashboard()
    assert dash["uid"] == "vllm-mmscope-multimodal" and "vllm" in dash["tags"]
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names == ["datasource", "job", "model_name", "instance", "engine"]
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    for title, ref, expr in targets(dash):
        for m in re.finditer(r"vllm:\w+\{([^}]*)\}", expr):
            assert all(f'{v}=~"${v}"' in m[1] for v in names[1:]), (title, ref, m[0])
