"""A router-like proxy on loopback for tests: each request to the next of its upstreams in turn
(round robin, blind to images, as a router without image affinity), the answer streamed back;
it logs where each chat request went and its body."""
from __future__ import annotations

import asyncio
import itertools
import json
import threading

import aiohttp
from aiohttp import web

from mmscope.load import client

CHAT_PATH = "/v1/chat/completions"


class RoundRobin:
    def __init__(self, upstreams: list[str]):
        self.upstreams = upstreams
        self.chats: list[tuple[str, dict]] = []  # (upstream, request body) in arrival order
        self._next = itertools.cycle(upstreams)
        self._started = threading.Event()
        self.url = ""

    def __enter__(self) -> "RoundRobin":
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), daemon=True)
        self._thread.start()
        if not self._started.wait(30):
            raise RuntimeError("the round-robin proxy did not start")
        return self

    def __exit__(self, *exc):
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        # As mmscope load's client: never a request on a connection vLLM is closing.
        idle = aiohttp.TCPConnector(keepalive_timeout=client.IDLE_KEPT_S)
        async with aiohttp.ClientSession(connector=idle) as self._http:
            self._started.set()
            await self._stop.wait()
        await runner.cleanup()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        upstream = next(self._next)
        if request.path == CHAT_PATH:
            self.chats.append((upstream, json.loads(body)))
        async with self._http.request(request.method, upstream + request.path_qs, data=body,
                                      headers={"Content-Type": request.content_type}) as answer:
            response = web.StreamResponse(status=answer.status, headers={
                "Content-Type": answer.headers.get("Content-Type", "text/plain")})
            await response.prepare(request)
            async for data in answer.content.iter_any():
                await response.write(data)
            await response.write_eof()
            return response
