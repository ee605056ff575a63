"""Talking to a live vLLM OpenAI server from tests: image chat requests and /metrics readouts."""
from __future__ import annotations

import base64
import io

import httpx

from mmscope.expose import readout
from tests.kit.engine import image


def data_url(i: int) -> str:
    buf = io.BytesIO()
    image(i).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def chat(url: str, model: str, images: list[int], text: str = "What is this?",
         max_tokens: int = 3) -> dict:
    content = [{"type": "image_url", "image_url": {"url": data_url(i)}} for i in images]
    content.append({"type": "text", "text": text})
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": model, "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens, "temperature": 0.0})
    r.raise_for_status()
    return r.json()


def metrics(url: str) -> dict[str, float]:
    return readout.from_prometheus_text(httpx.get(f"{url}/metrics", timeout=30).text)
