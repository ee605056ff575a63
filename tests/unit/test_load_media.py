"""`mmscope load --media`: which way each request sends its images, the URLs of the loopback
media server (a repeat's URL is its image's unless varied), what it answers and counts, and its
answer times within the latency and jitter."""
from __future__ import annotations

import json

import httpx

from mmscope.load import plan
from mmscope.load.media_urls import MediaOptions, Urls
from mmscope.load.media_server import MediaServer


def level_of(seed: int = 7):
    workload = plan.build(seed, [0.5], 4, 1, (8, 8), image_format="jpeg")
    return workload, workload.levels[0]


def test_requests_take_the_sources_in_turn():
    workload, level = level_of()
    options = MediaOptions(("data_url", "http"))
    assert [options.source(r) for r in level.requests] == ["data_url", "http"] * 2
    urls = Urls(workload, MediaOptions(("data_url",)))
    assert json.loads(b"".join(urls.of(level, level.requests[0])[0])).startswith("data:image/jpeg;base64,")


def test_a_repeats_url_is_its_images_unless_varied_and_the_server_answers_it():
    workload, level = level_of()
    repeated = next(r for r in level.requests if r.all_repeats).images[0]
    with MediaServer() as server:
        for vary in (False, True):
            urls = Urls(workload, MediaOptions(("http",), vary_urls=vary), server)
            sent = {r.index: [json.loads(b"".join(u)) for u in urls.of(level, r)]
                    for r in level.requests}
            senders = [r for r in level.requests if r.images[0] == repeated]
            of_image = {u for r in senders for u in sent[r.index]}
            assert len(senders) > 1 and len(of_image) == (len(senders) if vary else 1)
            first = level.requests[0]
            got = httpx.get(sent[0][0], trust_env=False)
            assert got.content == workload.image_file(level.level, first.images[0])
            assert got.headers["content-type"] == "image/jpeg"
            files = [workload.image_file(level.level, r.images[0]) for r in level.requests]
            assert urls.planned(level) == (4, sum(map(len, files)))
            urls.forget(level.level)
            assert httpx.get(sent[0][0], trust_env=False).status_code == 404
        assert server.counts() == (2, 2 * len(workload.image_file(level.level, first.images[0])))


def test_answer_times_lie_within_the_latency_and_its_jitter_drawn_from_the_seed():
    a, b = MediaServer(0.2, 0.05, seed=3), MediaServer(0.2, 0.05, seed=3)
    delays = [a.delay() for _ in range(200)]
    assert all(0.15 <= d <= 0.25 for d in delays) and len(set(delays)) > 100
    assert delays == [b.delay() for _ in range(200)]
    assert MediaServer(0.2).delay() == 0.2
