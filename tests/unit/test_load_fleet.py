"""One plan over many instances and processes, without an engine: the plan's lanes, the shards'
disjoint parts, the spread over instances, a router's bounds and their verdict, each instance's
share in the report; and runs against stand-in servers, two --url and two shards at once (with
Prometheus: tests/tools/test_load_prometheus.py; the real servers: tests/engine/test_load_fleet.py)."""
from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmscope.load import plan
from mmscope.load.observed import series
from mmscope.load.client import Timing
from mmscope.load.fleet import Shard, bounds
from mmscope.load.plan import LevelPlan, PlannedRequest
from mmscope.load.observed.prometheus import matcher, seconds
from mmscope.load.verdict import EXPLAINED, MATCH, ROUTED, UNEXPLAINED, Observed, judge
from tests.kit.stand_in import RUN_TIMEOUT_S, ImageCache, chat_stand_in, load_json


def lane_of_images(level: LevelPlan) -> dict[int, set[int]]:
    lanes: dict[int, set[int]] = {}
    for r in level.requests:
        for image in r.images:
            lanes.setdefault(image, set()).add(r.lane)
    return lanes


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), reuse=st.floats(0, 1), requests=st.integers(1, 40),
       per_request=st.integers(1, 3), lanes=st.integers(1, 6), prefix=st.booleans())
def test_every_sight_of_an_image_lies_in_its_lane(seed, reuse, requests, per_request, lanes,
                                                  prefix):
    make = plan.plan_prefix_level if prefix else plan.plan_level
    level = make(seed, 0, reuse, requests, per_request, lanes)
    assert [r.lane for r in level.requests] == [i % lanes for i in range(requests)]
    assert all(len(found) == 1 for found in lane_of_images(level).values())
    seen: set[int] = set()
    for r in level.requests:  # a repeat's image was sent before, a new one never
        assert all((i in seen) == repeat for i, repeat in zip(r.images, r.repeats))
        seen.update(r.images)
    most = max(requests - lanes, 0) * per_request  # each lane's first request repeats nothing
    if not prefix:
        assert level.planned_hits == min(int(reuse * requests * per_request + 0.5), most)


def test_one_lane_is_the_plan_of_one_server():
    one = plan.build(9, [0.5], 30, 2, (8, 8)).levels[0]
    assert one == plan.build(9, [0.5], 30, 2, (8, 8), lanes=1).levels[0]
    assert {r.lane for r in one.requests} == {0}
    # any earlier image of the level may repeat: the plan's repeats reach back across lanes
    assert one != plan.build(9, [0.5], 30, 2, (8, 8), lanes=3).levels[0]


@pytest.mark.parametrize("shards,instances", [(1, 1), (1, 3), (2, 1), (3, 2), (4, 3)])
def test_shards_are_disjoint_parts_that_make_up_the_plan(shards, instances):
    level = plan.build(4, [0.6], 50, 2, (8, 8), lanes=shards * instances).levels[0]
    parts = [Shard(k, shards).part(level, instances) for k in range(shards)]
    sent = [r.index for part in parts for r in part.requests]
    assert sorted(sent) == list(range(50))  # every request in exactly one part
    assert sum(p.planned_hits for p in parts) == level.planned_hits
    assert sum(p.images for p in parts) == level.images
    images = [{i for r in p.requests for i in r.images} for p in parts]
    assert all(not a & b for a, b in itertools.combinations(images, 2))  # no image in two parts
    for k, part in enumerate(parts):
        spread = Shard(k, shards).spread(part, instances)
        assert sorted(r.index for p in spread for r in p.requests) == \
            sorted(r.index for r in part.requests)
        held = [{i for r in p.requests for i in r.images} for p in spread]
        assert all(not a & b for a, b in itertools.combinations(held, 2))
        # each instance sees every sight of its images: its planned hits are exact
        assert sum(p.planned_hits for p in spread) == part.planned_hits


def scripted(*images_per_request: tuple[int, ...], reuse: float = 0.5) -> LevelPlan:
    requests, seen = [], set()
    for n, images in enumerate(images_per_request):
        requests.append(PlannedRequest(n, images, tuple(i in seen for i in images), f"r{n}"))
        seen.update(images)
    return LevelPlan(0, reuse, tuple(requests))


# Image 0 sent three times, 1 twice, 2 once, 3 with 0 and again alone: 4 repeats.
ROUTED_PLAN = scripted((0,), (1,), (0, 3), (2,), (1,), (0,), (3,))


def test_router_bounds_against_every_routing_of_the_plan():
    """Over two instances, all 2^7 routings: the image-ignorant figure is their mean, the fewest
    their least, the affine their most."""
    hits = []
    for route in itertools.product(range(2), repeat=len(ROUTED_PLAN.requests)):
        held: set[tuple[int, int]] = set()
        n = 0
        for r, instance in zip(ROUTED_PLAN.requests, route):
            n += sum((instance, i) in held for i in r.images)
            held.update((instance, i) for i in r.images)
        hits.append(n)
    b = bounds(ROUTED_PLAN, 2)
    assert (b.affine, b.fewest) == (max(hits), min(hits)) == (4, 1)
    assert b.ignorant == pytest.approx(sum(hits) / len(hits))
    one = bounds(ROUTED_PLAN, 1)
    assert one.affine == one.fewest == one.ignorant == 4
    assert bounds(ROUTED_PLAN, 5).fewest == 0


@pytest.mark.parametrize("hits,evictions,status", [
    (4, 0, MATCH),
    (1, 0, ROUTED),  # the fewest any router over two instances gives
    (0, 1, ROUTED),  # one eviction below it
    (0, 0, UNEXPLAINED),
    (2, 2, EXPLAINED),  # capacity explains what it can first
])
def test_a_routed_verdict_rests_on_the_router_bounds(hits, evictions, status):
    v = judge(ROUTED_PLAN, Observed(8, hits, evictions, 64, 16), None, bounds(ROUTED_PLAN, 2))
    assert v.status == status and v.ok is (status != UNEXPLAINED)
    # about 2: image 0 seen three times (1.25 hits expected), 1 and 3 twice (0.5 each)
    assert v.text.endswith("; over 2 instances an image-affine router gives 4 hits, an "
                           "image-ignorant one about 2 (at least 1)")
    if status == ROUTED:
        assert f"{hits} of 4 planned hits; shortfall explained by the router: repeats reached " \
               "instances that had not seen their image" in v.text


def two_instance_level():
    from mmscope.load.sweep import LevelResult, RequestResult

    level = plan.build(2, [0.5], 8, 1, (8, 8), lanes=2).levels[0]
    spread = dict(zip(("http://a:1", "http://b:2"), Shard(0).spread(level, 2)))
    deltas = {url: {series.QUERIES: p.images, series.HITS: p.planned_hits,
                    series.MISSES: p.distinct, f"{series.VLLM_TTFT}_count": len(p.requests),
                    f"{series.VLLM_TTFT}_sum": 0.01 * len(p.requests),
                    f"{series.VLLM_TTFT}_bucket{{le=0.01}}": len(p.requests),
                    f"{series.VLLM_TTFT}_bucket{{le=+Inf}}": len(p.requests)}
              for url, p in spread.items()}
    results = [RequestResult(r, Timing(0.01, 0.02, 20, 2)) for r in level.requests]
    return LevelResult(level, results, 1.0, deltas, {u: 64 for u in spread}, 16,
                       spread=spread), spread


def test_each_instance_has_its_share_in_the_report():
    from rich.console import Console

    from mmscope.load.report import RunInfo, level_json, print_terminal

    level, spread = two_instance_level()
    out = level_json(level)
    assert out["router"] is None and out["verdict"]["status"] == MATCH  # the client routed
    assert out["capacity_embeds"] == 128
    for url, part in spread.items():
        share = out["instances"][url]
        assert (share["requests"], share["planned_hits"], share["queries"], share["hits"],
                share["misses"], share["evictions"], share["capacity_embeds"]) == \
            (len(part.requests), part.planned_hits, part.images, part.planned_hits,
             part.distinct, 0, 64)
        assert share["ttft_ms"]["mean_ms"] == 10.0
    console = Console(record=True, width=250)
    info = RunInfo(tuple(spread), "m", 2, 8, 1, 4, (8, 8), 16, lanes=2,
                   counters="/metrics of each instance")
    print_terminal(info, [level], console)
    text = console.export_text()
    assert "the plan spread over 2 URLs, each image to one; counters from /metrics of each " \
        "instance" in text
    assert "each instance's share" in text
    rows = [[c.strip() for c in ln.split("│")[1:-1]] for ln in text.splitlines()
            if "http://a:1" in ln and ln.startswith("│")]
    a = spread["http://a:1"]
    assert rows == [["0.5", "http://a:1", str(len(a.requests)), "5.0 / 9.0", str(a.planned_hits),
                     str(a.images), str(a.planned_hits), str(a.distinct), "0",
                     f"{a.planned_hits / a.images:.0%}"]]


def test_where_a_router_spread_the_requests_the_verdict_holds_its_bounds():
    level, spread = two_instance_level()
    level.spread = None  # read from Prometheus: which instance took which request is unknown
    assert level.routed == bounds(level.plan, 2) and level.capacity_allows is None
    assert level.verdict.status == MATCH and "image-affine router gives" in level.verdict.text


def test_shard_and_matcher_arguments():
    from mmscope.load.command import shard

    assert shard("2/3") == Shard(1, 3) and shard("1/1") == Shard(0, 1)
    for bad in ("0/2", "3/2", "x", "1/", "1/2/3"):
        with pytest.raises(argparse.ArgumentTypeError):
            shard(bad)
    assert matcher(' {job="vllm"} ') == '{job="vllm"}'
    with pytest.raises(ValueError, match="a label matcher in braces"):
        matcher('job="vllm"')
    assert [seconds(d) for d in ("1s", "15s", "1m30s", "500ms", "2h", "junk")] == \
        [1, 15, 90, 0.5, 7200, 60.0]


# --- runs against stand-ins ---------------------------------------------------------------------
SWEEP = ("--image-size", "16x16", "--seed", "21", "--reuse", "0,0.5", "--requests", "12",
         "--images-per-request", "2", "--concurrency", "3")


def test_two_urls_share_one_plan_and_each_shows_its_own():
    caches = [ImageCache(capacity=1000), ImageCache(capacity=1000)]
    with chat_stand_in(caches[0]) as a, chat_stand_in(caches[1]) as b:
        out = load_json(a, "--url", b, *SWEEP)
    assert out["urls"] == [a, b] and out["shard"] == {"part": 1, "of": 1, "lanes": 2}
    whole = plan.build(21, [0, 0.5], 12, 2, (16, 16), lanes=2)
    for level, planned in zip(out["levels"], whole.levels):
        assert level["verdict"]["status"] == MATCH and level["router"] is None
        assert level["planned_hits"] == planned.planned_hits
        parts = dict(zip((a, b), Shard(0).spread(planned, 2)))
        for url, part in parts.items():
            share = level["instances"][url]
            assert (share["planned_hits"], share["queries"], share["hits"]) == \
                (part.planned_hits, part.images, part.planned_hits)
    # each stand-in was sent every sight of its images (and the probe went to the first)
    assert [c.counts["queries"] for c in caches] == [
        1 + sum(lv["instances"][a]["queries"] for lv in out["levels"]),
        sum(lv["instances"][b]["queries"] for lv in out["levels"])]


def test_two_shards_at_once_make_up_the_plan():
    caches = [ImageCache(capacity=1000), ImageCache(capacity=1000)]
    with chat_stand_in(caches[0]) as a, chat_stand_in(caches[1]) as b:
        runs = [subprocess.Popen([sys.executable, "-m", "mmscope.load.command", "--url", url,
                                  "--shard", f"{k}/2", "--json", *SWEEP],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for k, url in ((1, a), (2, b))]
        outs = [run.communicate(timeout=RUN_TIMEOUT_S) for run in runs]
    assert all(run.returncode == 0 for run in runs), outs
    shards = [json.loads(stdout) for stdout, _ in outs]
    whole = plan.build(21, [0, 0.5], 12, 2, (16, 16), lanes=2)
    for n, planned in enumerate(whole.levels):
        levels = [s["levels"][n] for s in shards]
        assert all(lv["verdict"]["status"] == MATCH for lv in levels)
        assert [lv["requests"] for lv in levels] == [6, 6]
        assert sum(lv["planned_hits"] for lv in levels) == planned.planned_hits
        assert sum(lv["observed_queries"] for lv in levels) == planned.images
    assert [s["shard"] for s in shards] == [{"part": 1, "of": 2, "lanes": 2},
                                            {"part": 2, "of": 2, "lanes": 2}]
