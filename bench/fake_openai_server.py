"""An instant OpenAI chat server for load benchmarks: streamed chat completions answered at once,
and /metrics counting each request's images as mmscope's plugin on vLLM counts them.

One aiohttp process. An image is keyed by its URL (a data URL is its content): its first sight a
miss, every later one a hit; nothing is evicted. `python bench/fake_openai_server.py --port P`.
"""
from __future__ import annotations

import argparse
import json

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from mmscope.expose.metrics import COUNTERS, GAUGES, LABELED

MODEL = "fake"
EMBEDS = 16  # prompt tokens an image adds, as the tiny LLaVA's 32x32 image
TEXT_TOKENS = 10
CAPACITY_EMBEDS = 1 << 30
ENGINE = {"model_name": MODEL, "engine": "0"}


class Counts:
    """The encoder-cache series of mmscope (names from mmscope.expose.metrics) over a cache of
    every image seen."""

    def __init__(self):
        self.registry = CollectorRegistry()
        labels = list(ENGINE)

        def counter(key):
            name, doc = COUNTERS[key]
            return Counter(name, doc, labels, registry=self.registry).labels(**ENGINE)

        self.queries, self.hits, self.misses = counter("queries"), counter("hits"), \
            counter("misses")
        self.query_embeds, self.hit_embeds = counter("query_embeds"), counter("hit_embeds")
        for key in ("deferrals", "evictions", "prefix_covered"):
            counter(key)  # there, at 0: nothing is deferred, evicted or covered
        name, extra, doc = LABELED["hits_by_source"]
        self.local_hits = Counter(name, doc, [*labels, extra], registry=self.registry).labels(
            **ENGINE, source="local")
        name, doc = GAUGES["capacity_embeds"]
        Gauge(name, doc, labels, registry=self.registry).labels(**ENGINE).set(CAPACITY_EMBEDS)
        self.seen: set[str] = set()

    def request(self, urls: list[str]) -> None:
        hits = sum(url in self.seen for url in urls)
        self.seen.update(urls)
        self.queries.inc(len(urls))
        self.query_embeds.inc(EMBEDS * len(urls))
        if hits:
            self.hits.inc(hits)
            self.hit_embeds.inc(EMBEDS * hits)
            self.local_hits.inc(hits)
        if len(urls) - hits:
            self.misses.inc(len(urls) - hits)


def sse(chunk: dict) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def stream(tokens: int, images: int) -> bytes:
    """The whole answer at once: a role chunk, one chunk a token, the usage, [DONE]."""
    usage = {"prompt_tokens": TEXT_TOKENS + EMBEDS * images, "completion_tokens": tokens}
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
              *({"choices": [{"index": 0, "delta": {"content": "x"}}]} for _ in range(tokens)),
              {"choices": [], "usage": usage}]
    return b"".join(map(sse, chunks)) + b"data: [DONE]\n\n"


def app() -> web.Application:
    counts = Counts()

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        urls = [part["image_url"]["url"] for message in body["messages"]
                if isinstance(message["content"], list)
                for part in message["content"] if part.get("type") == "image_url"]
        counts.request(urls)
        tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 1
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(stream(tokens, len(urls)))
        await response.write_eof()
        return response

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(counts.registry), content_type="text/plain")

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    application = web.Application(client_max_size=1 << 30)
    application.add_routes([web.post("/v1/chat/completions", chat), web.get("/v1/models", models),
                            web.get("/metrics", metrics), web.get("/health", health)])
    return application


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    web.run_app(app(), host="127.0.0.1", port=args.port, print=None, access_log=None,
                backlog=4096)


if __name__ == "__main__":
    main()
