"""`mmscope load` without a server: the plan, the capacity estimate and verdict, the streamed
client against scripted answers of an aiohttp server on loopback, the report, and the command
line's argument checks."""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from mmscope.errors import UserError
from mmscope.load import client, plan
from mmscope.load.observed import series
from mmscope.load.client import Server, Timing
from mmscope.load.plan import LevelPlan, PlannedRequest
from mmscope.load.verdict import EXCESS, EXPLAINED, MATCH, UNEXPLAINED, Observed, judge, lru_hits


def first_uses(level: LevelPlan) -> dict[int, int]:
    seen = {}
    for r in level.requests:
        for image, repeat in zip(r.images, r.repeats):
            seen.setdefault(image, r.index)
    return seen


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), reuse=st.floats(0, 1), requests=st.integers(1, 40),
       per_request=st.integers(1, 4))
def test_plan_invariants(seed, reuse, requests, per_request):
    level = plan.plan_level(seed, 0, reuse, requests, per_request)
    assert len(level.requests) == requests and level.images == requests * per_request
    want = min(int(reuse * requests * per_request + 0.5), (requests - 1) * per_request)
    assert level.planned_hits == want
    first = first_uses(level)
    for r in level.requests:
        assert len(set(r.images)) == len(r.images)  # never a repeat within a request
        for image, repeat in zip(r.images, r.repeats):
            # A repeat was first sent by an earlier request; a new image is sent here first.
            assert (first[image] < r.index) if repeat else (first[image] == r.index)
    assert level.distinct == len(first)
    # New images are numbered in order of first use.
    assert sorted(first, key=lambda i: (first[i], i)) == sorted(first)


def test_plan_is_deterministic_and_seeded():
    a = plan.build(7, [0, 0.5, 0.9], 20, 2, (32, 32))
    b = plan.build(7, [0, 0.5, 0.9], 20, 2, (32, 32))
    c = plan.build(8, [0, 0.5, 0.9], 20, 2, (32, 32))
    assert a.levels == b.levels and a.levels != c.levels
    assert a.data_url(1, 3) == b.data_url(1, 3) != c.data_url(1, 3)


def test_levels_and_probe_use_fresh_images():
    w = plan.build(3, [0.5, 0.5], 10, 1, (16, 16))
    urls = [{w.data_url(lv.level, i) for r in lv.requests for i in r.images} for lv in w.levels]
    assert len(urls[0]) == w.levels[0].distinct and not urls[0] & urls[1]
    assert w.data_url(plan.PROBE_LEVEL, 0) not in urls[0] | urls[1]


def decoded(data_url: tuple[bytes, ...]):
    import base64
    import io

    from PIL import Image

    url = json.loads(b"".join(data_url))
    img = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    img.load()  # every chunk's checksum and the image data's hold
    return url, img


@pytest.mark.parametrize("size", [(48, 20), (1, 1), (224, 224), (4096, 17)])
def test_images_are_files_of_the_format_and_size_asked(size):
    import base64

    import numpy as np

    for fmt in ("png", "jpeg"):
        workload = plan.build(1, [0.0, 0.0], 1, 1, size, image_format=fmt)
        url, img = decoded(workload.data_url(0, 0))
        assert url.startswith(f"data:image/{fmt};base64,")
        assert img.format == fmt.upper() and img.size == size and img.mode == "RGB"
        assert base64.b64decode(url.split(",", 1)[1]) == workload.image_file(0, 0)
    # A PNG holds exactly its level's canvas, its last row its own: images of a level differ
    # there, images of two levels everywhere.
    workload = plan.build(1, [0.0, 0.0], 1, 1, size)
    pixels = {(lv, i): np.asarray(decoded(workload.data_url(lv, i))[1])
              for lv, i in ((0, 0), (0, 1), (1, 0))}
    canvas = workload.canvas(0)
    width, height = size
    assert (pixels[(0, 0)][:-1] == canvas.rows[:-1, 1:].reshape(height - 1, width, 3)).all()
    assert (pixels[(0, 0)][-1] == canvas.last_row(0)[1:].reshape(-1, 3)).all()
    assert (pixels[(0, 0)][:-1] == pixels[(0, 1)][:-1]).all()
    assert (pixels[(0, 0)][-1] != pixels[(0, 1)][-1]).any()
    assert (pixels[(0, 0)] != pixels[(1, 0)]).any()


def test_repeats_fill_whole_requests():
    level = plan.plan_level(0, 0, 0.5, 10, 2)
    assert level.planned_hits == 10
    assert sum(r.all_repeats for r in level.requests) == 5
    assert not level.requests[0].repeats[0]


def test_prompts_are_unique_across_requests_levels_and_seeds():
    texts = [r.text for seed in (1, 2) for lv in plan.build(seed, [0, 0.9], 15, 1, (8, 8)).levels
             for r in lv.requests]
    assert len(set(texts)) == len(texts)


def scripted(*images_per_request: tuple[int, ...]) -> LevelPlan:
    requests, seen = [], set()
    for n, images in enumerate(images_per_request):
        requests.append(PlannedRequest(n, images, tuple(i in seen for i in images), f"r{n}"))
        seen.update(images)
    return LevelPlan(0, 0.5, tuple(requests))


def test_lru_hits_follows_vllm_eviction_order():
    level = scripted((0,), (1,), (0,), (2,), (1,), (0,))
    assert level.planned_hits == 3
    assert lru_hits(level, 10 * 16, 16) == 3  # room for all
    # Two slots: 0,1 | 0 hit (now newest) | 2 evicts 1 | 1 misses, evicts 0 | 0 misses.
    assert lru_hits(level, 2 * 16, 16) == 1
    assert lru_hits(level, 16, 16) == 0


def test_lru_hits_never_evicts_images_in_use():
    level = scripted((0, 1), (2, 3), (0, 1))
    assert lru_hits(level, 2 * 16, 16) == 0
    assert lru_hits(level, 4 * 16, 16) == 2


@pytest.mark.parametrize("hits,evictions,queries,status,words", [
    (3, 0, 6, MATCH, "hits match the plan (3 of 3)"),
    (1, 4, 6, EXPLAINED, "shortfall explained by capacity (4 evictions, capacity 32 embeds; "
                         "an LRU of that size allows 1 hits)"),
    (1, 1, 6, UNEXPLAINED, "1 hits missing that capacity does not explain"),
    (5, 0, 6, EXCESS, "2 hits more than planned"),
    (0, 0, 3, UNEXPLAINED, "3 queries for 6 images"),
])
def test_verdicts(hits, evictions, queries, status, words):
    level = scripted((0,), (1,), (0,), (2,), (1,), (0,))
    verdict = judge(level, Observed(queries, hits, evictions, 32, 16), lru_hits(level, 32, 16))
    assert verdict.status == status and words in verdict.text
    assert verdict.ok == (status != UNEXPLAINED)


def test_verdict_without_capacity_figures():
    level = scripted((0,), (0,))
    verdict = judge(level, Observed(2, 0, 0, None, None))
    assert verdict.status == UNEXPLAINED and "capacity unknown" in verdict.text
    assert "LRU" not in verdict.text


def test_series_names_match_the_adapter():
    from mmscope.expose import metrics

    exposed = {n for n, _ in metrics.COUNTERS.values()} | \
        {n for n, _ in metrics.GAUGES.values()} | \
        {n for n, _, _ in metrics.LABELED.values()}
    for key in (*series.COUNTERS, *series.GAUGES, series.HITS_BY_SOURCE):
        assert series.exposed(key).removesuffix("_total") in exposed


# --- the client, against scripted answers on loopback --------------------------------------------
def sse(*chunks) -> bytes:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode() + b"data: [DONE]\n\n"


async def _against(handler, call, timeout: float):
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    try:
        async with client.session(4) as http:
            return await call(Server(f"http://127.0.0.1:{port}/v1/", http, timeout))
    finally:
        await runner.cleanup()


def against(handler, call, timeout: float = 5.0):
    """`call(server)` with a Server whose every request `handler` (an aiohttp handler) answers."""
    return asyncio.run(_against(handler, call, timeout))


def chat(handler, images=((b'"data:image/png;base64,AA=="',),), timeout: float = 5.0) -> Timing:
    return against(handler, lambda server: server.chat("m", "hello", list(images), 2, "request 0"),
                   timeout)


def answer(status=200, body=b"", content_type="text/event-stream"):
    async def handler(request):
        return web.Response(status=status, body=body, content_type=content_type)
    return handler


def test_client_streams_text_first_and_reads_usage():
    seen = {}

    async def handler(request):
        seen.update(await request.json())
        seen["path"] = request.path
        return await answer(body=sse(
            {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
            {"choices": [{"delta": {"content": "x"}}]},
            {"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 2}}))(request)

    timing = chat(handler)
    assert seen["path"] == "/v1/chat/completions"
    content = seen["messages"][0]["content"]
    assert [part["type"] for part in content] == ["text", "image_url"]
    assert content[1]["image_url"]["url"] == "data:image/png;base64,AA=="
    assert seen["stream"] is True and seen["stream_options"] == {"include_usage": True}
    assert (seen["model"], seen["max_tokens"], seen["temperature"]) == ("m", 2, 0.0)
    assert 0 <= timing.ttft_s <= timing.e2e_s
    assert (timing.prompt_tokens, timing.completion_tokens) == (30, 2)


def test_a_stream_cut_anywhere_reads_the_same():
    """Lines split across arrivals, and a last line (the usage) without its newline."""
    usage = {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 1}}
    whole = (sse({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
             .removesuffix(b"data: [DONE]\n\n") + b"data: " + json.dumps(usage).encode())

    async def handler(request):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for a, b in itertools.pairwise((0, 3, 20, len(whole) - 10, len(whole))):
            await response.write(whole[a:b])
            await asyncio.sleep(0.02)  # each piece its own arrival
        await response.write_eof()
        return response

    timing = chat(handler)
    assert (timing.prompt_tokens, timing.completion_tokens) == (12, 1)


def test_chat_bodies_are_json_with_the_images_spliced_in():
    url = client.json_text('data:image/png;base64,AB+/"x"')
    body = json.loads(client.chat_body("m", 'say "hi"', [url, url], 7, images_first=True))
    assert body["messages"] == [{"role": "user", "content": [
        *[{"type": "image_url", "image_url": {"url": 'data:image/png;base64,AB+/"x"'}}] * 2,
        {"type": "text", "text": 'say "hi"'}]}]
    assert json.loads(client.chat_body("m", None, [url], 1))["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": 'data:image/png;base64,AB+/"x"'}}]


@pytest.mark.parametrize("response,message", [
    (answer(400, json.dumps({"error": {"message": "At most 1 image(s) may be\nprovided"}}).encode(),
            "application/json"), "request 0: HTTP 400: At most 1 image(s) may be provided"),
    (answer(404, b'{"detail": "Not Found"}', "application/json"), "request 0: HTTP 404: Not Found"),
    (answer(500, b"<html>boom</html>", "text/html"), "request 0: HTTP 500: <html>boom</html>"),
    (answer(body=sse({"error": {"message": "engine dead"}})),
     "request 0: the server reported an error: engine dead"),
    (answer(body=b"data: [DONE]\n\n"), "request 0: the server's stream ended without a token"),
])
def test_client_errors_are_one_line(response, message):
    with pytest.raises(UserError) as e:
        chat(response)
    assert str(e.value) == message


def test_client_connection_refused_and_slow_server():
    async def refused(http):
        return await Server("http://127.0.0.1:9/v1/", http, 5).chat("m", "hello", [], 2,
                                                                    "request 0")

    async def run():
        async with client.session(4) as http:
            return await refused(http)

    with pytest.raises(UserError, match=r"^request 0: cannot reach http://127.0.0.1:9: "):
        asyncio.run(run())

    async def slow(request):
        await asyncio.sleep(5)

    with pytest.raises(UserError, match=r"no complete answer .* within 0.2 s"):
        chat(slow, timeout=0.2)


def test_metrics_page_must_be_prometheus():
    with pytest.raises(UserError, match="is not a Prometheus metrics page"):
        against(answer(body=b"{not prometheus", content_type="text/plain"),
                lambda server: server.metrics())


# --- report and arguments -----------------------------------------------------------------------
def fake_level(reuse=0.5, capacity=32, hits=3, evictions=0):
    from mmscope.load.sweep import LevelResult, RequestResult

    level = scripted((0,), (1,), (0,), (2,), (1,), (0,))
    level = LevelPlan(0, reuse, level.requests)
    results = [RequestResult(r, Timing(0.01 * (1 + r.index), 0.1, 20, 2)) for r in level.requests]
    delta = {series.QUERIES: 6, series.HITS: hits, series.MISSES: 6 - hits,
             series.EVICTIONS: evictions, series.by_source("local"): hits,
             series.cache_queries("mm_cache"): 6, series.cache_hits("mm_cache"): 3}
    return LevelResult(level, results, 1.5, {"http://x": delta}, {"http://x": capacity}, 16)


def test_json_report_shape():
    from mmscope.load.report import RunInfo, run_json

    info = RunInfo(("http://x",), "m", 1, 6, 1, 2, (32, 32), 16)
    out = run_json(info, [fake_level(), fake_level(0.9, hits=1, evictions=0)])
    assert out["ok"] is False
    first = out["levels"][0]
    for key in ("reuse", "requests", "images", "planned_hits", "observed_queries", "observed_hits"):
        assert key in first
    assert set(first["ttft_ms"]) == {"repeat_p50", "repeat_p90", "new_p50", "new_p90"}
    assert first["ttft_ms"]["repeat_p50"] == 50.0  # requests 2, 4, 5: 30, 50, 60 ms
    assert first["ttft_ms"]["new_p50"] == 20.0  # requests 0, 1, 3: 10, 20, 40 ms
    assert first["hits_by_source"] == {"local": 3, "in_step": 0, "connector": 0}
    assert first["mm_cache"] == {"queries": 6, "hits": 3}
    assert first["throughput_rps"] == 4.0 and first["verdict"]["status"] == MATCH
    json.dumps(out)


def test_terminal_report_and_plot(tmp_path):
    from rich.console import Console

    from mmscope.load.report import RunInfo, print_terminal, write_plot

    levels = [fake_level(0.0), fake_level(0.5, hits=1, evictions=3)]
    console = Console(record=True, width=200)
    print_terminal(RunInfo(("http://x",), "m", 1, 6, 1, 2, (32, 32), 16), levels, console)
    text = console.export_text()
    assert "encoder cache per reuse level" in text and "32 embeds" in text
    assert "reuse 0.5: 1 of 3 planned hits; shortfall explained by capacity" in text
    write_plot(str(tmp_path / "p.png"), levels)
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_percentile_matches_numpy():
    import numpy as np

    from mmscope.load.report import percentile

    values = [5.0, 1.0, 9.0, 3.0, 7.5]
    for q in (0, 50, 90, 100):
        assert percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert percentile([], 50) is None


@pytest.mark.parametrize("argv,wrong", [
    (["--reuse", "0,1.5"], "reuse levels must lie in [0, 1]"),
    (["--reuse", "a,b"], "not a comma-separated list"),
    (["--image-size", "32"], "expected WIDTHxHEIGHT"),
    (["--requests", "0"], "must be at least 1"),
    (["--timeout", "-1"], "must be positive"),
])
def test_bad_arguments(argv, wrong, capsys):
    from mmscope.load.command import main

    with pytest.raises(SystemExit) as e:
        main(["--url", "http://127.0.0.1:1", *argv])
    assert e.value.code == 2 and wrong in capsys.readouterr().err


def test_bad_url_scheme(capsys):
    from mmscope.load.command import main

    assert main(["--url", "127.0.0.1:8000", "--seed", "1"]) == 2
    assert capsys.readouterr().err.strip() == ("mmscope: error: --url must start with http:// or "
                                               "https://, not '127.0.0.1:8000'")


def test_add_arguments_defaults():
    from mmscope.load.command import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--url", "http://h"])
    assert args.reuse == [0, 0.5, 0.9] and args.image_size == (224, 224) and args.seed is None


def test_the_prefix_plan_repeats_whole_requests_with_their_long_text():
    from mmscope.load import plan

    level = plan.build(7, [0.5], 10, 2, (32, 32), prefix=True).levels[0]
    repeats = [r for r in level.requests if r.all_repeats]
    assert len(repeats) == 5 and level.planned_hits == 10 and level.distinct == 10
    originals = {(r.images, r.text) for r in level.requests if not any(r.repeats)}
    assert all((r.images, r.text) in originals for r in repeats)  # each resends one whole
    assert not level.requests[0].all_repeats  # the first has nothing to repeat
    assert all(len(r.text.split()) > plan.PREFIX_WORDS for r in level.requests)
    assert len({r.text for r in level.requests}) == 5  # new requests differ from each other


def test_prefix_covered_items_count_as_avoided_hits_in_the_verdict():
    from mmscope.load import plan
    from mmscope.load.verdict import Observed, judge

    level = plan.build(7, [0.5], 4, 1, (32, 32), prefix=True).levels[0]
    spared = judge(level, Observed(queries=2, hits=0, evictions=0, capacity_embeds=64,
                                   embeds_per_image=16, prefix_covered=2))
    assert spared.status == "match"
    assert spared.text == "hits match the plan (2 of 2) (0 hits, 2 prefix-covered)"
    short = judge(level, Observed(queries=3, hits=0, evictions=0, capacity_embeds=64,
                                  embeds_per_image=16, prefix_covered=1))
    assert short.status == "unexplained" and short.text.startswith(
        "1 of 2 planned hits (0 hits, 1 prefix-covered); 1 hits missing")
