"""End to end without nsys: `mmscope record` around the real OpenAI server (plugin installed,
VLLM_NVTX_SCOPES_FOR_PROFILING=1), a few image requests, Ctrl-C, then `mmscope analyze`."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from mmscope import stages
from mmscope.demo.serve import free_port
from tests.kit.server import chat

pytestmark = pytest.mark.vllm


def test_record_the_server_then_analyze(tiny_model, tmp_path):
    out, port = tmp_path / "server.sqlite", free_port()
    env = dict(os.environ, VLLM_NVTX_SCOPES_FOR_PROFILING="1", VLLM_CPU_KVCACHE_SPACE="1",
               HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    env.pop("MMSCOPE_TRACE", None)
    log = open(tmp_path / "record.log", "w")
    rec = subprocess.Popen(
        [sys.executable, "-m", "mmscope.cli", "record", "-o", str(out), "--",
         sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", tiny_model,
         "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "1024",
         "--enforce-eager"], env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert rec.poll() is None, (tmp_path / "record.log").read_text()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        chat(url, tiny_model, [701, 702], "Two?")
        chat(url, tiny_model, [701], "Again?")
        chat(url, tiny_model, [], "Text only")
    finally:
        os.killpg(rec.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends
        rec.wait(120)
        log.close()
    assert out.stat().st_size > 0, (tmp_path / "record.log").read_text()[-3000:]

    done = subprocess.run([sys.executable, "-m", "mmscope.cli", "analyze", str(out), "--json"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    count = {s["name"]: s["count"] for s in report["stages"]}
    # Three images sent as data URLs: three hashes on that branch (start-up's dummies are PIL).
    assert count[stages.hash_range("image_bytes")] == 3
    # The encoder ran once (the first request's two new images); the repeat was a cache hit.
    assert count[stages.VIT_FORWARD] == 1
    for name in (stages.PREPROCESS, stages.FORWARD, stages.GATHER_MM_EMBEDDINGS,
                 stages.EMBED_INPUT_IDS, stages.processor_range("apply_hf_processor")):
        assert count.get(name, 0) >= 1, name
    assert all(c["ok"] for c in report["checks"]), report["checks"]
