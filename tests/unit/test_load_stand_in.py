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
import time
from collections import OrderedDict
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.kit.cli import one_line_error

RUN_TIMEOUT_S = 120
EMBEDS = 16  # prompt tokens one image adds on the stand-in
TEXT_TOKENS = 10
PLAIN_VLLM_METRICS = ("# HELP vllm:prefix_cache_queries_total Prefix cache queries.\n"
                      "# TYPE vllm:prefix_cache_queries_total counter\n"
                      'vllm:prefix_cache_queries_total{model_name="m",engine="0"} 0.0\n')
MMSCOPE_METRICS = PLAIN_VLLM_METRICS + (
    "# TYPE vllm:encoder_cache_queries_total counter\n"
    'vllm:encoder_cache_queries_total{model_name="m",engine="0"} 0.0\n')


def load(url: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mmscope.load.command", "--url", url, *args],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, **kwargs)


def load_json(url: str, *args: str, status: int = 0) -> dict:
    done = load(url, "--json", *args)
    assert done.returncode == status, done.stderr
    assert all(ln.startswith("wrote ") for ln in done.stderr.splitlines()), done.stderr
    return json.loads(done.stdout)


# --- a stand-in with an encoder cache: an LRU of whole images -------------------------------------
class ImageCache:
    """Counts as mmscope's plugin names them. `capacity` images fit; `keeps` False: nothing is
    ever stored and nothing evicted (hits go missing without a cause)."""

    def __init__(self, capacity: int, keeps: bool = True):
        self.capacity, self.keeps = capacity, keeps
        self.resident: OrderedDict[str, None] = OrderedDict()
        self.counts = dict.fromkeys(("queries", "hits", "misses", "evictions"), 0)
        self.answered: set[str] = set()
        self.early_repeats = 0  # images asked for again before their first request was answered
        self.lock = threading.Lock()

    def request(self, images: list[str]) -> int:
        """Looks the images up; returns how many missed."""
        misses = self.counts["misses"]
        with self.lock:
            for url in images:
                self.counts["queries"] += 1
                self.early_repeats += url in self.resident and url not in self.answered
                if url in self.resident:
                    self.counts["hits"] += 1
                    self.resident.move_to_end(url)
                    continue
                self.counts["misses"] += 1
                if self.keeps:
                    self.resident[url] = None
                    while len(self.resident) > self.capacity:
                        self.resident.popitem(last=False)
                        self.counts["evictions"] += 1
            return self.counts["misses"] - misses

    def answer(self, images: list[str]) -> None:
        with self.lock:
            self.answered.update(images)

    def page(self) -> str:
        with self.lock:
            c = dict(self.counts)
        labels = 'model_name="m",engine="0"'
        # the queries and hits in embeddings too: 16 an image, as the header says
        c.update(query_embeds=16 * c["queries"], hit_embeds=16 * c["hits"])
        lines = [f"# TYPE vllm:encoder_cache_{k}_total counter\n"
                 f"vllm:encoder_cache_{k}_total{{{labels}}} {v}.0\n" for k, v in c.items()]
        lines.append("# TYPE vllm:encoder_cache_hits_by_source_total counter\n"
                     f'vllm:encoder_cache_hits_by_source_total{{{labels},source="local"}} '
                     f'{c["hits"]}.0\n')
        lines.append("# TYPE vllm:encoder_cache_capacity_embeds gauge\n"
                     f"vllm:encoder_cache_capacity_embeds{{{labels}}} "
                     f"{self.capacity * EMBEDS}.0\n")
        return "".join(lines)


def sse(*chunks: dict) -> str:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


@contextmanager
def serving(get_routes, post):
    """A loopback HTTP server: GET paths from `get_routes()`, POST bodies to `post(body)`."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            routes = get_routes()
            if self.path not in routes:
                return self._send(404, "application/json", '{"detail": "Not Found"}')
            self._send(200, *routes[self.path])

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self._send(*post(body))

        def _send(self, status, kind, text):
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

        def handle(self):
            try:
                super().handle()
            except ConnectionError:  # a reader that leaves early, as one test's does
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def chat_stand_in(cache: ImageCache, first_sight_s: float = 0.0):
    """`first_sight_s`: how long a request with an image new to the cache takes to answer."""
    def post(body):
        content = body["messages"][0]["content"]
        images = [part["image_url"]["url"] for part in content if part["type"] == "image_url"]
        if cache.request(images):
            time.sleep(first_sight_s)
        cache.answer(images)
        usage = {"prompt_tokens": TEXT_TOKENS + EMBEDS * len(images),
                 "completion_tokens": body["max_tokens"]}
        return 200, "text/event-stream", sse(
            {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
            {"choices": [{"delta": {"content": "x" * body["max_tokens"]}}]},
            {"choices": [], "usage": usage})

    models = ("application/json", json.dumps({"data": [{"id": "m"}]}))
    with serving(lambda: {"/v1/models": models, "/metrics": ("text/plain", cache.page())},
                 post) as url:
        yield url


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
