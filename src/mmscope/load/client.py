"""Talking to the servers under test: model list, /metrics, and streamed chat completions timed to
the first token; every failure becomes a one-line `UserError`.

One aiohttp session carries every request of a run, to every server (a pool fit for thousands in
flight). Only the given URLs are contacted (no proxies from the environment either).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

import aiohttp
import yarl

from mmscope.errors import UserError
from mmscope.expose import readout
from mmscope.load.observed import series

CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
METRICS_PATH = "/metrics"
SSE_DATA = b"data:"
SSE_DONE = b"[DONE]"
MESSAGE_CHARS = 200  # a server's error text is cut to this, on one line
MAX_PORT = 65535
JSON = {"Content-Type": "application/json"}


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
        parsed = yarl.URL(url)
    except ValueError as e:
        raise UserError(f"{flag} {given!r} is not a URL: {e}") from None
    if not parsed.host:
        raise UserError(f"{flag} {given!r} names no host")
    if parsed.explicit_port is not None and not 1 <= parsed.explicit_port <= MAX_PORT:
        raise UserError(f"{flag} {given!r}: port {parsed.explicit_port} is out of range "
                        f"(1-{MAX_PORT})")
    if parsed.query_string or parsed.fragment:
        raise UserError(f"{flag} {given!r}: a base URL has no query or fragment")
    return url.removesuffix("/v1")


# vLLM's server closes a connection idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s by default): one
# idle for longer than this is not used again, so that no request goes out on a connection the
# server is closing (its answer would be a reset, after a pause between levels say).
IDLE_KEPT_S = 4.0


def session(connections: int) -> aiohttp.ClientSession:
    """The run's one session: `connections` open at once at most, over all servers. Made inside
    the running event loop."""
    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=0,
                                     keepalive_timeout=IDLE_KEPT_S)
    return aiohttp.ClientSession(connector=connector, trust_env=False)


class Server:
    def __init__(self, url: str, http: aiohttp.ClientSession, request_timeout_s: float,
                 flag: str = "--url"):
        self.base = self.url = base_url(url, flag)  # `url` names it in reports
        self.http = http
        self.request_timeout_s = request_timeout_s
        self.timeout = aiohttp.ClientTimeout(total=request_timeout_s)

    async def models(self) -> list[str]:
        body = await self._get_json(MODELS_PATH)
        try:
            return [m["id"] for m in body["data"]]
        except (KeyError, TypeError):
            raise UserError(f"{self.base}{MODELS_PATH} is not an OpenAI model list") from None

    async def metrics(self) -> dict[str, float]:
        text = (await self._get(METRICS_PATH)).decode(errors="replace")
        try:
            return readout.from_prometheus_text(text, histograms=series.READ_HISTOGRAMS)
        except ValueError:
            raise UserError(f"{self.base}{METRICS_PATH} is not a Prometheus metrics page") from None

    async def chat(self, model: str, text: str, image_urls: list[Url], max_tokens: int,
                   what: str, images_first: bool = False) -> Timing:
        """One streamed chat completion. The text goes first, so that requests differ from token
        one, unless `images_first` (the prefix plan, where the repeats' prefixes are shared)."""
        return await self.send(chat_body(model, text, image_urls, max_tokens, images_first), what)

    async def send(self, body: bytes, what: str) -> Timing:
        """One streamed chat completion of a ready body, timed to its first token."""
        try:
            return await self._stream(body, what)
        except TimeoutError:
            raise UserError(f"{what}: no complete answer from {self.base} within "
                            f"{self.request_timeout_s:g} s (--request-timeout)") from None
        except aiohttp.ClientError as e:
            raise UserError(f"{what}: {_transport_error(self.base, e)}") from None

    async def _stream(self, body: bytes, what: str) -> Timing:
        start = time.perf_counter()
        first, usage = None, {}

        def take(lines: list[bytes]) -> None:
            nonlocal first, usage
            for line in lines:
                if first is not None and b'"usage"' not in line and b'"error"' not in line:
                    continue  # a token after the first: nothing in it to read
                chunk = _sse_chunk(line, what)
                if chunk is None:
                    continue
                if first is None and chunk.get("choices"):
                    first = time.perf_counter()
                usage = chunk.get("usage") or usage

        async with self.http.post(self.base + CHAT_PATH, data=body, headers=JSON,
                                  timeout=self.timeout) as response:
            if response.status >= 400:
                raise UserError(f"{what}: {_http_error(response.status, await response.read())}")
            rest = b""
            # Whatever has arrived, cut into lines here: the stream reader's line at a time costs
            # a call a line, a third of an instant answer's time.
            async for data in response.content.iter_any():
                *lines, rest = (rest + data).split(b"\n")
                take(lines)
            take([rest])
        end = time.perf_counter()
        if first is None:
            raise UserError(f"{what}: the server's stream ended without a token")
        return Timing(first - start, end - start, usage.get("prompt_tokens"),
                      usage.get("completion_tokens"))

    async def _get(self, path: str) -> bytes:
        try:
            async with self.http.get(self.base + path, timeout=self.timeout) as response:
                data = await response.read()
        except TimeoutError:
            raise UserError(f"{self.base} did not answer in time") from None
        except aiohttp.ClientError as e:
            raise UserError(_transport_error(self.base, e)) from None
        if response.status >= 400:
            raise UserError(f"GET {self.base}{path}: {_http_error(response.status, data)}")
        return data

    async def _get_json(self, path: str):
        data = await self._get(path)
        try:
            return json.loads(data)
        except ValueError:
            raise UserError(f"{self.base}{path} did not answer JSON; is this an OpenAI-compatible "
                            "server?") from None


Url = tuple[bytes, ...]  # a URL as the pieces of its JSON string, quotes included


def json_text(value: str) -> Url:
    """A URL as `chat_body` takes it."""
    return (json.dumps(value).encode(),)


IMAGE_PART = b'{"type":"image_url","image_url":{"url":'


def chat_body(model: str, text: str | None, image_urls: list[Url], max_tokens: int,
              images_first: bool = False) -> bytes:
    """A streamed chat request of one user message: `text` (none if None) and the images. Each
    image URL comes as the pieces of its JSON string and is spliced in as it is, all copied once:
    an image of a few hundred KB is never encoded again for each request that carries it."""
    images = [(IMAGE_PART, *url, b"}}") for url in image_urls]
    words = [] if text is None else [(json.dumps({"type": "text", "text": text}).encode(),)]
    options = json.dumps({"model": model, "max_tokens": max_tokens, "temperature": 0.0,
                          "stream": True, "stream_options": {"include_usage": True}}).encode()
    pieces = [b'{"messages":[{"role":"user","content":[']
    for n, part in enumerate(images + words if images_first else words + images):
        pieces += [b","] * (n > 0) + list(part)
    return b"".join([*pieces, b"]}],", options[1:]])


def _sse_chunk(line: bytes, what: str) -> dict | None:
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


def _transport_error(url: str, e: aiohttp.ClientError) -> str:
    if isinstance(e, aiohttp.ClientConnectorError):
        return f"cannot reach {url}: {one_line(str(e.os_error)) or 'connection failed'}"
    return f"talking to {url} failed: {one_line(str(e)) or type(e).__name__}"


def _http_error(status: int, data: bytes) -> str:
    try:
        message = _message(json.loads(data))
    except ValueError:
        message = one_line(data.decode(errors="replace"))
    return f"HTTP {status}" + (f": {message}" if message else "")


def _message(body) -> str:
    """vLLM and OpenAI say {"error": {"message": ...}}; FastAPI says {"detail": ...}."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict):
            inner = inner.get("message") or inner.get("detail") or inner
        return one_line(str(inner))
    return one_line(str(body))


def one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MESSAGE_CHARS else line[:MESSAGE_CHARS - 1] + "…"
