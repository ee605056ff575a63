"""`mmscope load` end to end against stand-in servers the test starts on loopback: one that speaks
the OpenAI chat API (streamed) over an LRU of images and serves its counters on /metrics, and ones
that fail, stall, refuse or lack mmscope's counters. No engine: the real server is tests/engine."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager

import pytest

from tests.kit.cli import one_line_error
from tests.kit.stand_in import (EMBEDS, MMSCOPE_METRICS, PLAIN_VLLM_METRICS, RUN_TIMEOUT_S,
                                ImageCache, chat_stand_in, load, load_json, serving)

SWEEP = ("--image-size", "16x16", "--seed", "11")


def test_counts_equal_the_plan_when_the_cache_holds_every_image(tmp_path):
    plot = tmp_path / "sweep.svg"
    with chat_stand_in(ImageCache(capacity=1000)) as url:
        out = load_json(url, *SWEEP, "--reuse", "0,0.5,0.9", "--requests", "10",
                        "--images-per-request", "2", "--concurrency", "3", "--plot", str(plot))
    assert (out["model"], out["ok"], out["embeds_per_image"]) == ("m", True, EMBEDS)
    assert [lv["planned_hits"] for lv in out["levels"]] == [0, 10, 18]
    for level in out["levels"]:
        assert level["observed_queries"] == level["images"] == 20
        assert level["observed_hits"] == level["planned_hits"] == level["capacity_allows_hits"]
        assert level["observed_misses"] == level["distinct_images"]
        assert level["hits_by_source"]["local"] == level["observed_hits"]
        assert level["capacity_embeds"] == 1000 * EMBEDS and level["evictions"] == 0
        assert level["verdict"] == {"status": "match", "text": f"hits match the plan "
                                    f"({level['planned_hits']} of {level['planned_hits']})"}
    assert plot.read_text().lstrip().startswith("<?xml")


def test_a_repeat_leaves_once_its_first_sight_is_answered():
    """Sent together, a server could encode the repeat first, and the plan's hit (and a hit's
    time to first token) would land on the other request."""
    cache = ImageCache(capacity=1000)
    with chat_stand_in(cache, first_sight_s=0.05) as url:
        out = load_json(url, *SWEEP, "--reuse", "0.5,0.9", "--requests", "12",
                        "--images-per-request", "2", "--concurrency", "4")
    assert [lv["observed_hits"] for lv in out["levels"]] == [12, 22]
    assert cache.early_repeats == 0


def test_a_small_cache_gives_a_shortfall_that_capacity_explains():
    with chat_stand_in(ImageCache(capacity=2)) as url:
        out = load_json(url, *SWEEP, "--reuse", "0.5", "--requests", "30", "--concurrency", "1")
    level = out["levels"][0]
    shortfall = level["planned_hits"] - level["observed_hits"]
    assert 0 < shortfall <= level["evictions"]
    # One request at a time, an LRU of two images is what the estimate replays at 32 embeds.
    assert level["observed_hits"] == level["capacity_allows_hits"]
    assert level["verdict"]["status"] == "explained" and out["ok"] is True
    assert f"{level['evictions']} evictions, capacity 32 embeds" in level["verdict"]["text"]


def test_hits_missing_without_evictions_fail_the_run():
    with chat_stand_in(ImageCache(capacity=1000, keeps=False)) as url:
        done = load(url, *SWEEP, "--reuse", "0,0.5", "--requests", "8")
    assert done.returncode == 1, done.stderr
    verdicts = [ln for ln in done.stdout.splitlines() if ln.startswith("reuse ")]
    assert verdicts == ["reuse 0: hits match the plan (0 of 0)",
                        "reuse 0.5: 0 of 4 planned hits; 4 hits missing that capacity does not "
                        "explain (0 evictions, capacity 16000 embeds; an LRU of that size allows "
                        "4 hits)"]


def test_the_table_shows_the_figures_of_the_json():
    args = (*SWEEP, "--reuse", "0.5", "--requests", "8", "--concurrency", "2")
    with chat_stand_in(ImageCache(capacity=3)) as url:
        table = load(url, *args)
    with chat_stand_in(ImageCache(capacity=3)) as url2:
        out = load_json(url2, *args)
    assert table.returncode == 0, table.stderr
    lv = out["levels"][0]
    lines = table.stdout.splitlines()
    assert lines[0] == f"mmscope load: {url}, model m, seed 11"
    assert lines[1] == ("per level: 8 requests of 1 image, concurrency 2; 16x16 png images "
                        "(16 embeds each); encoder cache 48 embeds")
    rows = [[c.strip() for c in ln.split("│")[1:-1]] for ln in lines if ln.startswith("│")]
    cells = [row for row in rows if row and row[0] == "0.5"]
    assert cells[0][:11] == ["0.5", "8", "8", str(lv["planned_hits"]), str(lv["observed_queries"]),
                             str(lv["observed_hits"]), str(lv["observed_prefix_covered"]),
                             f"{lv['observed_hit_rate']:.0%} ({lv['planned_hit_rate']:.0%})",
                             f"{lv['observed_embed_hit_rate']:.0%}",
                             f"{lv['observed_avoided_rate']:.0%}",
                             f"{lv['observed_saved_embed_rate']:.0%}"]
    assert lv["observed_query_embeds"] == 16 * lv["observed_queries"]
    assert lv["observed_hit_embeds"] == 16 * lv["observed_hits"]
    assert cells[1] == ["0.5", str(lv["observed_hits"]), "0", "0", "0", str(lv["evictions"]),
                        str(lv["capacity_allows_hits"]), "0 / 0", "0 / 0"]
    assert lines[-1] == f"reuse 0.5: {lv['verdict']['text']}"


def test_a_reader_that_leaves_early_ends_the_sweep_quietly():
    read_end, write_end = os.pipe()
    os.close(read_end)
    with chat_stand_in(ImageCache(capacity=100)) as url:
        try:
            done = subprocess.run([sys.executable, "-m", "mmscope.cli", "load", "--url", url,
                                   "--json", *SWEEP, "--requests", "2"], stdout=write_end,
                                  stderr=subprocess.PIPE, text=True, timeout=RUN_TIMEOUT_S)
        finally:
            os.close(write_end)
    assert done.returncode == 128 + signal.SIGPIPE and done.stderr == ""


# --- stand-ins for servers that are not vLLM with mmscope ----------------------------------------
@contextmanager
def failing_stand_in(metrics: str, chat_status: int = 400, chat_delay_s: float = 0.0):
    """/v1/models, /metrics, and a chat endpoint that fails or stalls."""
    stop = threading.Event()

    def post(body):
        if chat_delay_s:
            stop.wait(chat_delay_s)
        return chat_status, "application/json", json.dumps(
            {"error": {"message": "the model is asleep", "code": 400}})

    models = ("application/json", json.dumps({"data": [{"id": "m"}]}))
    try:
        with serving(lambda: {"/v1/models": models, "/metrics": ("text/plain", metrics)},
                     post) as url:
            yield url
    finally:
        stop.set()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    message = one_line_error(load(url, "--timeout", "30"))
    assert message.startswith(f"mmscope: error: cannot reach {url}")


def test_wrong_model_name():
    with failing_stand_in(MMSCOPE_METRICS) as url:
        message = one_line_error(load(url, "--model", "no-such-model"))
    assert message == (f"mmscope: error: model 'no-such-model' is not served at {url} (it serves: "
                       "m)")


def test_server_without_mmscope_counters():
    with failing_stand_in(PLAIN_VLLM_METRICS) as url:
        message = one_line_error(load(url))
    assert message == (f"mmscope: error: {url}/metrics: no vllm:encoder_cache_queries_total: is "
                       "mmscope installed in the server's Python environment (vLLM loads it as a "
                       "plugin)?")


def test_error_answer_from_the_server():
    with failing_stand_in(MMSCOPE_METRICS) as url:
        message = one_line_error(load(url + "/v1"))
    assert message == ("mmscope: error: probe request without an image: HTTP 400: "
                       "the model is asleep")


@pytest.mark.parametrize("option,message", [
    ("--request-timeout", "no complete answer from {url} within 0.5 s (--request-timeout)"),
    ("--timeout", "the sweep did not finish within --timeout 0.5 s; raise it or send fewer "
                  "--requests"),
])
def test_request_and_total_timeouts(option, message):
    with failing_stand_in(MMSCOPE_METRICS, chat_status=200, chat_delay_s=10) as url:
        done = load(url, option, "0.5")
    assert one_line_error(done).endswith(message.format(url=url))
