"""`mmscope load --prometheus` against a real Prometheus scraping two stand-in servers (no engine):
the counters read as a router would leave them, and a matcher Prometheus refuses or that matches
nothing, one line each (the real servers: tests/engine/test_load_fleet.py)."""
from __future__ import annotations

import pytest

from mmscope.load.observed import series
from tests.kit.cli import one_line_error
from tests.kit.stand_in import ImageCache, chat_stand_in, load, load_json

SWEEP = ("--image-size", "16x16", "--seed", "22", "--reuse", "0,0.5", "--requests", "12",
         "--images-per-request", "2", "--concurrency", "3")


@pytest.fixture(scope="module")
def scraped_stand_ins(tmp_path_factory):
    """Two stand-ins and a real Prometheus scraping both every second."""
    from tests.kit.prometheus import Prometheus

    caches = [ImageCache(capacity=1000), ImageCache(capacity=1000)]
    with chat_stand_in(caches[0]) as a, chat_stand_in(caches[1]) as b:
        targets = [url.removeprefix("http://") for url in (a, b)]
        with Prometheus(targets, str(tmp_path_factory.mktemp("prometheus"))) as prom:
            for target in targets:  # scraped once: the fleet's series are there
                prom.wait_for_scrape_after(
                    f'{series.exposed(series.QUERIES)}{{instance="{target}"}}', 0)
            yield a, b, prom


def test_counters_from_prometheus_as_a_router_would_leave_them(scraped_stand_ins):
    a, b, prom = scraped_stand_ins
    out = load_json(a, "--url", b, "--prometheus", prom.url, "--prometheus-match",
                    '{job="vllm"}', *SWEEP)
    assert out["counters"] == f'Prometheus {prom.url} {{job="vllm"}}'
    for level in out["levels"]:
        # counted by instance as Prometheus labels them; the client's spread is unknown there
        assert set(level["instances"]) == {a.removeprefix("http://"), b.removeprefix("http://")}
        assert level["router"]["instances"] == 2
        assert level["observed_hits"] == level["planned_hits"] == level["router"]["affine_hits"]
        assert level["verdict"]["status"] == "match"
        assert all(share["planned_hits"] is None for share in level["instances"].values())


@pytest.mark.parametrize("match,says", [
    ('{job=}', 'Prometheus refused it: '),
    ('{job="nothing"}', 'no vllm:encoder_cache_queries_total series: does it scrape the fleet'),
])
def test_a_matcher_prometheus_refuses_or_that_matches_nothing(scraped_stand_ins, match, says):
    a, _, prom = scraped_stand_ins
    done = load(a, "--prometheus", prom.url, "--prometheus-match", match, "--seed", "1")
    assert says in one_line_error(done)
