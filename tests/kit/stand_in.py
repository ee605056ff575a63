"""Stand-ins for an OpenAI server with mmscope's counters, on loopback, for `mmscope load`'s tests
without an engine: chat completions streamed over an LRU of whole images whose counts /metrics
serves, and `mmscope load` run against them."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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
