"""End to end without nsys: `mmscope record` around the real OpenAI server (plugin installed,
VLLM_NVTX_SCOPES_FOR_PROFILING=1, chrome traces beside), a few image requests, SIGTERM while a
long answer is still being generated, then `mmscope analyze` on the recording and on the chrome
traces: the step the stop cut is no failed check."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import threading

import httpx
import pytest

from mmscope import stages
from mmscope.demo.serve import free_port
from tests.kit.server import chat

pytestmark = pytest.mark.vllm


def test_record_the_server_then_analyze(tiny_model, tmp_path):
    out, port = tmp_path / "server.sqlite", free_port()
    traces = tmp_path / "traces"
    env = dict(os.environ, VLLM_NVTX_SCOPES_FOR_PROFILING="1", VLLM_CPU_KVCACHE_SPACE="1",
               HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", MMSCOPE_TRACE="nvtx,chrome",
               MMSCOPE_TRACE_DIR=str(traces))
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
        # A long answer (text only), stopped while the worker steps: its last step is cut.
        threading.Thread(target=lambda: _quietly(chat, url, tiny_model, [], "Long?", 900),
                         daemon=True).start()
        time.sleep(1.5)
    finally:
        # The stop a user makes: SIGTERM to the API server alone (vLLM's default shutdown kills
        # EngineCore and the workers at once); the recorder then writes its file.
        for child in _children(rec.pid) or [rec.pid]:
            os.kill(child, signal.SIGTERM)
        rec.wait(120)
        log.close()
    assert out.stat().st_size > 0, (tmp_path / "record.log").read_text()[-3000:]

    report = analyze(out)
    count = {s["name"]: s["count"] for s in report["stages"]}
    # Three images sent as data URLs: three hashes on that branch (start-up's dummies are PIL).
    assert count[stages.hash_range("image_bytes")] == 3
    # The encoder ran once (the first request's two new images); the repeat was a cache hit.
    assert count[stages.VIT_FORWARD] == 1
    for name in (stages.PREPROCESS, stages.FORWARD, stages.GATHER_MM_EMBEDDINGS,
                 stages.EMBED_INPUT_IDS, stages.processor_range("apply_hf_processor")):
        assert count.get(name, 0) >= 1, name
    assert all(c["ok"] for c in report["checks"]), report["checks"]

    # The chrome traces of the same run, cut by the stop too: every check passes.
    traced = analyze(traces)
    assert all(c["ok"] for c in traced["checks"]), traced["checks"]
    joined = next(c for c in traced["checks"] if c["name"].startswith("every step_meta"))
    print("chrome traces after the stop:", joined["detail"])


def analyze(path) -> dict:
    done = subprocess.run([sys.executable, "-m", "mmscope.cli", "analyze", str(path), "--json",
                           "--no-cache"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _quietly(call, *args):
    try:
        call(*args)
    except httpx.HTTPError:  # the server stopped under it: what the test wants
        pass
