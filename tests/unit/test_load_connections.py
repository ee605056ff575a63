"""mmscope load's connections to a server: an idle one is used again only while the server still
keeps it (vLLM's server closes one idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE seconds)."""
from __future__ import annotations

import asyncio

from aiohttp import web

from mmscope.load import client


def test_an_idle_connection_is_dropped_before_vllm_closes_it():
    from vllm import envs

    assert client.IDLE_KEPT_S < envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE


def test_the_session_uses_a_connection_again_only_within_the_idle_time(monkeypatch):
    """Two requests close together share a connection; after a pause longer than the idle time
    kept, the second goes out on a new one (the server sees another peer port)."""
    monkeypatch.setattr(client, "IDLE_KEPT_S", 0.3)

    async def run(pause: float) -> int:
        peers = set()

        async def answer(request):
            peers.add(request.transport.get_extra_info("peername")[1])
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_get("/", answer)
        runner = web.AppRunner(app, keepalive_timeout=30)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
        try:
            async with client.session(1) as http:
                for _ in range(2):
                    async with http.get(url) as got:
                        assert await got.text() == "ok"
                    await asyncio.sleep(pause)
        finally:
            await runner.cleanup()
        return len(peers)

    assert asyncio.run(run(0.05)) == 1
    assert asyncio.run(run(0.6)) == 2
