"""Talking to a live vLLM OpenAI server from tests: image and video chat requests and /metrics
readouts."""
from __future__ import annotations

import base64
import functools
import io
import os
import tempfile

import re
import time

import httpx

from mmscope.expose import readout
from tests.kit.engine import image


@functools.lru_cache(maxsize=256)
def png(i: int) -> bytes:
    """Image i's PNG file, as a client would upload or link it."""
    buf = io.BytesIO()
    image(i).save(buf, format="PNG")
    return buf.getvalue()


@functools.lru_cache(maxsize=256)
def data_url(i: int) -> str:
    return "data:image/png;base64," + base64.b64encode(png(i)).decode()


def video_data_url(i: int, frames: int = 4, size=(56, 56), fps: float = 2.0) -> str:
    """An mp4 of mmscope.demo.inputs.video(i): vLLM decodes it with OpenCV, which it installs."""
    import cv2

    from mmscope.demo import inputs

    array, _ = inputs.video(i, frames, size, fps)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "clip.mp4")
        writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"mp4v"), fps, size)
        for frame in array:
            writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
        writer.release()
        with open(path, "rb") as f:
            return "data:video/mp4;base64," + base64.b64encode(f.read()).decode()


def chat(url: str, model: str, images: list[int], text: str = "What is this?",
         max_tokens: int = 3) -> dict:
    content = [{"type": "image_url", "image_url": {"url": data_url(i)}} for i in images]
    return chat_parts(url, model, content, text, max_tokens)


def chat_parts(url: str, model: str, parts: list[dict], text: str = "What is this?",
               max_tokens: int = 3) -> dict:
    """One user message: the given media parts, then the text."""
    content = [*parts, {"type": "text", "text": text}]
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": model, "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens, "temperature": 0.0})
    r.raise_for_status()
    return r.json()


def metrics(url: str) -> dict[str, float]:
    return readout.from_prometheus_text(httpx.get(f"{url}/metrics", timeout=30).text)


def stream_chat(url: str, model: str, images: list[int], text: str = "What is this?",
                max_tokens: int = 3) -> tuple[str, float]:
    """One streamed chat completion: (the response id, the client's time to first token). One
    client for all: a new httpx client costs tens of milliseconds (its TLS context), which would
    count as time to first token."""
    import json
    import time

    content = [*({"type": "image_url", "image_url": {"url": data_url(i)}} for i in images),
               {"type": "text", "text": text}]
    body = {"model": model, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0.0, "stream": True}
    start, first, response_id = time.perf_counter(), None, None
    with _streaming_client().stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            chunk = json.loads(line[len("data:"):])
            response_id = response_id or chunk.get("id")
            if first is None and chunk.get("choices"):  # as mmscope load times it
                first = time.perf_counter()
    return response_id, first - start


@functools.cache
def _streaming_client() -> httpx.Client:
    return httpx.Client(timeout=120, trust_env=False)


def histograms(url: str, *names: str) -> dict[str, float]:
    """/metrics counters and gauges, and the samples of the named histograms."""
    return readout.from_prometheus_text(httpx.get(f"{url}/metrics", timeout=30).text,
                                        histograms=names)


PROBE = re.compile(r"mm_ttft_probe req=(\S+) encoder_cache=(hit|miss) (.*)$")


def probe_lines(srv, ids: set[str], timeout_s: float = 15) -> dict[str, tuple[str, dict]]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = {}
        for line in srv.log_text().splitlines():
            m = PROBE.search(line)
            if m and m[1] in ids:
                assert m[1] not in found, f"two probe lines for {m[1]}"
                values = dict(kv.split("=") for kv in m[3].split())
                found[m[1]] = (m[2], {k: float(v) for k, v in values.items()})
        if len(found) == len(ids) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)
