"""Talking to the server under test: model list, /metrics, and streamed chat completions timed to
the first token; every failure becomes a one-line `UserError`.

Only the given base URL is contacted (no proxies from the environment either).
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import httpx

from mmscope.expose import readout
from mmscope.load import series
from mmscope.errors import UserError

CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
METRICS_PATH = "/metrics"
SSE_DATA = "data:"
SSE_DONE = "[DONE]"
MESSAGE_CHARS = 200  # a server's error text is cut to this, on one line
MAX_PORT = 65535


@dataclass(frozen=True)
class Timing:
    ttft_s: float
    e2e_s: float
    prompt_tokens: int | None
    completion_tokens: int | None


def base_url(url: str, flag: str = "--url") -> str:
    """The server root, also when given as an OpenAI base URL ending in /v1; a URL that names no
    server (no host, a port out of range, a query) is a one-line error, naming its `flag`, before
    anything is sent."""
    given, url = url, url.strip()
    if not url.startswith(("http://", "https://")):
        raise UserError(f"{flag} must start with http:// or https://, not {given!r}")
    url = url.rstrip("/")
    if any(c.isspace() for c in url):
        raise UserError(f"{flag} {given!r} contains a space")
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as e:
        raise UserError(f"{flag} {given!r} is not a URL: {e}") from None
    if not parsed.host:
        raise UserError(f"{flag} {given!r} names no host")
    if parsed.port is not None and not 1 <= parsed.port <= MAX_PORT:
        raise UserError(f"{flag} {given!r}: port {parsed.port} is out of range (1-{MAX_PORT})")
    if parsed.query or parsed.fragment:
        raise UserError(f"{flag} {given!r}: a base URL has no query or fragment")
    return url.removesuffix("/v1")


class Server:
    def __init__(self, url: str, request_timeout_s: float, concurrency: int = 1,
                 flag: str = "--url"):
        self.url = base_url(url, flag)
        self.request_timeout_s = request_timeout_s
        limits = httpx.Limits(max_connections=concurrency + 1)
        self.http = httpx.AsyncClient(base_url=self.url, timeout=request_timeout_s,
                                      limits=limits, trust_env=False)

    async def close(self) -> None:
        await self.http.aclose()

    async def models(self) -> list[str]:
        body = await self._get_json(MODELS_PATH)
        try:
            return [m["id"] for m in body["data"]]
        except (KeyError, TypeError):
            raise UserError(f"{self.url}{MODELS_PATH} is not an OpenAI model list") from None

    async def metrics(self) -> dict[str, float]:
        response = await self._get(METRICS_PATH)
        try:
            return readout.from_prometheus_text(response.text, histograms=series.READ_HISTOGRAMS)
        except ValueError:
            raise UserError(f"{self.url}{METRICS_PATH} is not a Prometheus metrics page") from None

    async def chat(self, model: str, text: str, image_urls: list[str], max_tokens: int,
                   what: str, images_first: bool = False) -> Timing:
        """One streamed chat completion. The text goes first, so that requests differ from token
        one, unless `images_first` (the prefix plan, where the repeats' prefixes are shared)."""
        images = [{"type": "image_url", "image_url": {"url": u}} for u in image_urls]
        words = [{"type": "text", "text": text}]
        content = images + words if images_first else words + images
        body = {"model": model, "messages": [{"role": "user", "content": content}],
                "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
                "stream_options": {"include_usage": True}}
        return await self.send(body, what)

    async def send(self, body: dict, what: str) -> Timing:
        """One streamed chat completion of a ready body, timed to its first token."""
        try:
            return await asyncio.wait_for(self._stream(body, what), self.request_timeout_s)
        except (TimeoutError, httpx.TimeoutException):
            raise UserError(f"{what}: no complete answer from {self.url} within "
                            f"{self.request_timeout_s:g} s (--request-timeout)") from None
        except httpx.HTTPError as e:
            raise UserError(f"{what}: {_transport_error(self.url, e)}") from None

    async def _stream(self, body: dict, what: str) -> Timing:
        start = time.perf_counter()
        first, usage = None, {}
        async with self.http.stream("POST", CHAT_PATH, json=body) as response:
            if response.status_code >= 400:
                await response.aread()
                raise UserError(f"{what}: {_http_error(response)}")
            async for line in response.aiter_lines():
                chunk = _sse_chunk(line, what)
                if chunk is None:
                    continue
                if first is None and chunk.get("choices"):
                    first = time.perf_counter()
                usage = chunk.get("usage") or usage
        end = time.perf_counter()
        if first is None:
            raise UserError(f"{what}: the server's stream ended without a token")
        return Timing(first - start, end - start, usage.get("prompt_tokens"),
                      usage.get("completion_tokens"))

    async def _get(self, path: str) -> httpx.Response:
        try:
            response = await self.http.get(path)
        except httpx.HTTPError as e:
            raise UserError(_transport_error(self.url, e)) from None
        if response.status_code >= 400:
            raise UserError(f"GET {self.url}{path}: {_http_error(response)}")
        return response

    async def _get_json(self, path: str):
        response = await self._get(path)
        try:
            return response.json()
        except ValueError:
            raise UserError(f"{self.url}{path} did not answer JSON; is this an OpenAI-compatible "
                            "server?") from None


def _sse_chunk(line: str, what: str) -> dict | None:
    if not line.startswith(SSE_DATA):
        return None
    payload = line[len(SSE_DATA):].strip()
    if not payload or payload == SSE_DONE:
        return None
    try:
        chunk = json.loads(payload)
    except ValueError:
        raise UserError(f"{what}: the server streamed something that is not JSON") from None
    if isinstance(chunk, dict) and "error" in chunk:
        raise UserError(f"{what}: the server reported an error: {_message(chunk)}")
    return chunk if isinstance(chunk, dict) else None


def _transport_error(url: str, e: httpx.HTTPError) -> str:
    if isinstance(e, httpx.ConnectError):
        return f"cannot reach {url}: {_one_line(str(e)) or 'connection failed'}"
    if isinstance(e, httpx.TimeoutException):
        return f"{url} did not answer in time"
    return f"talking to {url} failed: {_one_line(str(e)) or type(e).__name__}"


def _http_error(response: httpx.Response) -> str:
    try:
        message = _message(response.json())
    except ValueError:
        message = _one_line(response.text)
    return f"HTTP {response.status_code}" + (f": {message}" if message else "")


def _message(body) -> str:
    """vLLM and OpenAI say {"error": {"message": ...}}; FastAPI says {"detail": ...}."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict):
            inner = inner.get("message") or inner.get("detail") or inner
        return _one_line(str(inner))
    return _one_line(str(body))


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MESSAGE_CHARS else line[:MESSAGE_CHARS - 1] + "…"
