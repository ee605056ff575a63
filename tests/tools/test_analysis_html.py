"""The HTML report in a real browser: headless Chromium (Debian package `chromium`, installed by
scripts/setup.sh) opens the one file offline, runs its script, and the figures it shows (the
icicle's nodes, self time by stage, the per-step bars, the cache section) are the JSON's.

The profile is tests/kit/nsys.nested_file with its GPU work (CUPTI tables); the /metrics page is
written by mmscope's own series through prometheus_client, as a server's page is.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from functools import partial
from html.parser import HTMLParser

import pytest

from mmscope import stages
from mmscope.analyze.report.text import fmt_ns
from tests.kit import nsys as F

VIT = stages.VIT_FORWARD
UNITS = {"ns": 1, "µs": 1e3, "ms": 1e6, "s": 1e9}
DURATION = re.compile(r"(\d+(?:\.\d+)?) (ns|µs|ms|s)\b")
# (request is a hit, ttft, parts in stages.TTFT_PARTS order), in seconds
REQUESTS = ((True, 0.10, (0.01, 0.005, 0.005, 0.01, 0.0, 0.0, 0.06, 0.01)),
            (True, 0.14, (0.01, 0.01, 0.01, 0.01, 0.0, 0.0, 0.09, 0.01)),
            (False, 0.30, (0.01, 0.005, 0.005, 0.02, 0.15, 0.0, 0.10, 0.01)))


def metrics_page(path) -> None:
    """A /metrics page of 10 encoder-cache queries, 4 hits (3 local, 1 in the same step), their
    ways through the cache layers, and the three requests' time to first token by part."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    from mmscope.carry import item_ways
    from mmscope.carry.ttft_split import TtftSplit
    from mmscope.expose.metrics import EncoderCacheProm, MetricClasses
    from mmscope.expose.ttft_histograms import TtftProm

    registry = CollectorRegistry()
    labels = {0: ["tiny", "0"]}
    cache = EncoderCacheProm(MetricClasses(partial(Counter, registry=registry),
                                           partial(Gauge, registry=registry),
                                           partial(Histogram, registry=registry)), labels, ("image",), 4096)
    cache.observe({"queries": 10, "hits": 4, "misses": 6, "hits_by_source:local": 3,
                   "hits_by_source:in_step": 1, "usage_embeds": 1536}, 0)
    # the same items' ways: the processor cache held the 4 repeats; the encoder took 1 ms an
    # embedding, so each 16-embedding hit saved 16 ms
    costs = item_ways.EngineCostTotals()
    costs.add({"encoder_ns:image": 96_000_000, "encoder_embeds:image": 96})
    waiting = item_ways.ProcessorWays()
    waiting.looked_up([(f"h{i}", i >= 6) for i in range(10)])
    sent = [(f"h{i}", "image", "computed" if i < 6 else "cache_hit", 16) for i in range(10)]
    cache.observe_ways(item_ways.join(sent, waiting, item_ways.ProcessorCosts(), costs), costs, 0)
    ttft = TtftProm(partial(Histogram, registry=registry), labels)
    for i, (hit, total, parts) in enumerate(REQUESTS):
        ttft.observe(TtftSplit(f"r{i}", 0, hit, total, dict(zip(stages.TTFT_PARTS, parts)),
                               f"internal-{i}"))
    path.write_bytes(generate_latest(registry))


class Dom(HTMLParser):
    """The elements of the dumped DOM (tag, attributes, text inside), in document order."""

    def __init__(self, text: str):
        super().__init__()
        self.elements: list[dict] = []
        self.open: list[dict] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        element = {"tag": tag, "attrs": dict(attrs), "text": "", "children": []}
        if self.open:
            self.open[-1]["children"].append(element)
        self.elements.append(element)
        if tag not in ("meta", "br", "img", "input", "link"):
            self.open.append(element)

    def handle_endtag(self, tag):
        while self.open:
            if self.open.pop()["tag"] == tag:
                break

    def handle_data(self, data):
        for element in self.open:
            element["text"] += data

    def having(self, tag: str, cls: str) -> list[dict]:
        return [e for e in self.elements if e["tag"] == tag and e["attrs"].get("class") == cls]


def title_of(element: dict) -> str:
    (title,) = [c for c in element["children"] if c["tag"] == "title"]
    return title["text"]


def durations(text: str) -> list[float]:
    return [float(v) * UNITS[u] for v, u in DURATION.findall(text)]


def shown_as(shown: float, ns: int) -> bool:
    """A duration printed to three significant digits stands for this many nanoseconds."""
    return abs(shown - ns) <= max(0.0051 * abs(ns), 0.5)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    assert shutil.which("chromium"), "chromium is not on PATH (scripts/setup.sh installs it)"
    base = tmp_path_factory.mktemp("html")
    profile = F.nested_file(base / "nested.sqlite", scale=1037, gpu=True)
    metrics_page(base / "metrics.txt")
    page = base / "report.html"
    common = [sys.executable, "-m", "mmscope.cli", "analyze", profile, "--no-cache",
              "--metrics", str(base / "metrics.txt")]
    done = subprocess.run(common + ["--html", str(page)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    doc = json.loads(subprocess.run(common + ["--json"], capture_output=True, text=True,
                                    timeout=120, check=True).stdout)
    browser = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", f"--user-data-dir={base / 'chromium'}",
         "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert browser.returncode == 0, browser.stderr[-2000:]
    return page.read_text(encoding="utf-8"), Dom(browser.stdout), doc


def test_one_file_that_fetches_nothing(report):
    text, dom, _ = report
    assert not re.search(r"\b(src|href)\s*=", text) and "url(" not in text
    assert "<link" not in text and "@import" not in text
    (body,) = [e for e in dom.elements if e["tag"] == "body"]
    assert body["attrs"].get("data-rendered") == "yes", "the report's script did not finish"


def test_the_icicle_shows_each_nodes_figures(report):
    _, dom, doc = report
    nodes = {n["id"]: n for n in doc["tree"]}
    drawn = dom.having("g", "node")
    assert {int(g["attrs"]["data-id"]) for g in drawn} == {
        k for k, n in nodes.items() if n["total_ns"] > 0}
    for g in drawn:
        n = nodes[int(g["attrs"]["data-id"])]
        title = title_of(g)
        head, figures, counts = title.split("\n")
        assert head == n["name"]
        total, self_ns = durations(figures)
        assert shown_as(total, n["total_ns"]) and shown_as(self_ns, n["self_ns"]), title
        assert counts.startswith(f"{n['count']} ranges, ")
        mean, p50, p90, p99 = durations(counts)
        for shown, key in zip((mean, p50, p90, p99), ("mean_ns", "p50_ns", "p90_ns", "p99_ns")):
            assert shown_as(shown, n[key]), (key, title)
        if n["parent"] is not None:
            parent = nodes[n["parent"]]
            assert f"({100 * n['share_of_parent']:.1f}% of {parent['name']})" in figures


def test_the_share_of_parent_drawn_is_over_the_parents_whole_time(report):
    _, dom, doc = report
    (vit,) = [n for n in doc["tree"] if n["name"] == stages.VIT_FORWARD]
    assert vit["share_of_parent"] == round(850 / 2130, 6)
    (g,) = [g for g in dom.having("g", "node") if int(g["attrs"]["data-id"]) == vit["id"]]
    assert f"(39.9% of {stages.PREPROCESS})" in title_of(g)


def test_self_time_by_stage_adds_up_each_roles_time_once(report):
    _, dom, doc = report
    for role in doc["profile"]["roles"]:
        expected: dict[str, int] = {}
        for n in doc["tree"]:
            if n["role"] == role and n["self_ns"]:
                expected[n["name"]] = expected.get(n["name"], 0) + n["self_ns"]
        holder = [e for e in dom.having("div", "self-holder") if e["attrs"]["data-role"] == role]
        bars = [c for c in holder[0]["children"][0]["children"] if c["tag"] == "g"]
        assert {b["attrs"]["data-stage"] for b in bars} == set(expected)
        for b in bars:
            (shown, *_) = durations(b["text"])
            assert shown_as(shown, expected[b["attrs"]["data-stage"]])


def test_the_per_step_view_draws_every_steps_parts_and_kind(report):
    _, dom, doc = report
    view = doc["per_step"]
    steps = dom.having("g", "step")
    assert len(steps) == view["shown"] == 5
    for i, g in enumerate(steps):
        assert int(g["attrs"]["data-step"]) == i
        assert g["attrs"]["data-kind"] == view["kind"][i]
        assert int(g["attrs"]["data-total-ns"]) == sum(view["ns"][i])
        parts = {c["attrs"]["data-part"]: int(c["attrs"]["data-ns"])
                 for c in g["children"] if "data-part" in c["attrs"]}
        assert parts == {p: ns for p, ns in zip(view["parts"], view["ns"][i]) if ns > 0}
        assert f"{view['kind'][i]} step at " in title_of(g)
        assert (f"prefill {view['prefill'][i]}, decode {view['decode'][i]} tokens"
                in title_of(g))
    assert [int(g["attrs"]["data-total-ns"]) for g in steps][:3] == [
        1037 * (1000 + 1000), 1037 * (600 + 700), 1037 * (200 + 600)]


def test_the_cache_section_shows_counters_benefit_and_ttft(report):
    _, dom, doc = report
    text = next(e for e in dom.elements if e["tag"] == "body")["text"]
    cache, benefit = doc["cache"], doc["cache_benefit"]
    assert cache["hit_rate"] == 0.4 and "hit rate 40.0%" in text
    assert cache["counters"]["encoder_cache_misses"] == 6
    assert cache["hits_by_source"] == {"local": 3, "in_step": 1, "connector": 0}
    assert (benefit["compared_kind"], benefit["preprocess_saved_ns"]) == ("prefill", 600 * 1037)
    assert (f"a prefill step without encoder work spends {fmt_ns(600 * 1037)} less in "
            "preprocess") in text
    rows = [[c["text"] for c in tr["children"]] for tr in dom.elements if tr["tag"] == "tr"]
    assert ["prefill", "2", fmt_ns(800 * 1037), fmt_ns(600 * 1037), fmt_ns(425 * 1037), "1",
            fmt_ns(200 * 1037), fmt_ns(200 * 1037), fmt_ns(600 * 1037)] in rows
    assert (cache["layers"]["encoder"], cache["layers"]["processor"]) == (
        {"cache_hit": 4, "prefix_covered": 0, "ec_loaded": 0, "computed": 6},
        {"hit": 4, "miss": 6, "off": 0})
    assert "Where items were served from" in text
    assert ["encoder cache", "4", "0.0640"] in rows and ["encoder (computed)", "6", ""] in rows
    hits = cache["ttft"]["hit"]
    assert hits["requests"] == 2 and hits["ttft"]["mean_ms"] == 120.0
    assert "Time to first token, hits (2 requests)" in text
    assert ["encoder", "150", hits_p(cache, "miss", "encoder", "p50_ms"),
            hits_p(cache, "miss", "encoder", "p90_ms")] in rows


def hits_p(cache, outcome, part, key) -> str:
    value = cache["ttft"][outcome]["parts"][part][key]
    return "-" if value is None else f"{value:g}"


def test_host_and_device_time_by_stage(report):
    _, dom, doc = report
    stages = {s["name"]: s for s in doc["stages"]}
    bars = dom.having("g", "hostdev-bar")
    assert {b["attrs"]["data-stage"] for b in bars} == {
        n for n, s in stages.items() if max(s["total_ns"], s["device_ns"]) > 0}
    for b in bars:
        s = stages[b["attrs"]["data-stage"]]
        assert int(b["attrs"]["data-host-ns"]) == s["total_ns"]
        assert int(b["attrs"]["data-device-ns"]) == s["device_ns"]
        host, device, kernels = durations(title_of(b))
        assert shown_as(host, s["total_ns"]) and shown_as(device, s["device_ns"])
        assert shown_as(kernels, s["kernel_ns"])
    vit = stages[VIT]
    # Each vit_forward launches one kernel running half its length: 350 and 500 units.
    assert (vit["device_ns"], vit["kernel_ns"]) == (1037 * (250 + 175), 1037 * (250 + 175))


def test_the_kernels_under_each_stage(report):
    _, dom, doc = report
    shown = [(r["attrs"]["data-stage"], [c["text"] for c in r["children"]])
             for r in dom.having("tr", "kernel")]
    expected = [(s["name"], [s["name"], k["name"], str(k["count"]), fmt_ns(k["total_ns"])])
                for s in doc["stages"] for k in s["kernels"]]
    assert shown == expected
    assert (stages.FORWARD, [stages.FORWARD, "decode_attn", "5",
                             fmt_ns(1037 * (500 + 350 + 300 + 200 + 150))]) in shown
    assert (stages.FORWARD, [stages.FORWARD, "[CUDA memset]", "5", fmt_ns(5 * 1037)]) in shown


def test_each_step_shows_its_device_time(report):
    _, dom, doc = report
    view = doc["per_step"]
    marks = [[c for c in g["children"] if c["attrs"].get("class") == "device"]
             for g in dom.having("g", "step")]
    assert [int(m["attrs"]["data-ns"]) for (m,) in marks] == view["device_ns"]
    # The first step: its vit_forward's kernel (250) and its forward's kernel and memset.
    assert view["device_ns"][0] == 1037 * (250 + 500 + 1)
    for g, device_ns in zip(dom.having("g", "step"), view["device_ns"]):
        assert f", device {fmt_ns(device_ns)}" in title_of(g)
