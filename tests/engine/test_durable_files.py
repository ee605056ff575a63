"""Nothing the plugin writes is lost at a normal stop of a real server (docs/design.md §9): vLLM's default
shutdown kills EngineCore without atexit, so the access log and the chrome traces must reach the
disk within about a second while the server runs, and keep every committed record after SIGTERM."""
from __future__ import annotations

import glob
import os
import signal
import time

import pytest

from mmscope.cache_size import trace
from mmscope.demo.serve import VllmServer
from mmscope.errors import UserError
from mmscope.emit.chrome import read_events
from tests.kit.server import chat, metrics

pytestmark = pytest.mark.vllm


def engine_log(path) -> trace.EngineTrace | None:
    """The server's one engine as the access log shows it so far (None before its first access)."""
    try:
        (engine,) = trace.load(str(path)).engines.values()
    except UserError:
        return None
    return engine


def wait_for(predicate, timeout_s: float = 10.0):
    """Poll until predicate() holds; a bound on how long data may wait, not a speed test."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


@pytest.fixture(scope="module")
def stopped(tiny_model, tmp_path_factory):
    base = tmp_path_factory.mktemp("durable")
    log, traces = base / "access.log", base / "traces"
    srv = VllmServer(tiny_model, str(base / "vllm.log"),
                     env={"MMSCOPE_ACCESS_LOG": str(log), "MMSCOPE_TRACE": "chrome",
                          "MMSCOPE_TRACE_DIR": str(traces)})
    srv.start()
    try:
        for seeds in ([1], [2], [1], [3, 2]):
            chat(srv.url, srv.model, seeds)
        counted = metrics(srv.url)
        # While it runs: every committed item is on disk within about a second.
        while_running = wait_for(lambda: (e := engine_log(log)) is not None
                                 and e.accesses == counted["encoder_cache_queries"])
        chat(srv.url, srv.model, [4])  # committed just before the stop
        time.sleep(1.5)
        counted = metrics(srv.url)
        # The stop a user makes: SIGTERM to the API server alone; vLLM's default shutdown.
        srv.proc.send_signal(signal.SIGTERM)
        srv.proc.wait(60)
    finally:
        srv.stop()
    return log, traces, counted, while_running


def test_the_access_log_is_on_disk_while_the_server_runs(stopped):
    assert stopped[3], "the access log did not hold every committed item within 10 s"


def test_the_access_log_keeps_every_committed_item_after_sigterm(stopped):
    log, _, counted, _ = stopped
    engine = engine_log(log)
    assert engine.accesses == counted["encoder_cache_queries"] == 6
    assert engine.accesses - engine.hits == counted["encoder_cache_misses"] == 4
    assert engine.capacity == counted["encoder_cache_capacity_embeds"]  # the line at start
    assert engine.bytes_per_embed == 64 * 2  # the tiny LLaVA: 64 wide, bfloat16


def test_the_chrome_traces_are_readable_and_hold_the_stages_after_sigterm(stopped):
    _, traces, counted, _ = stopped
    names = []
    for path in glob.glob(os.path.join(traces, "*.trace.json")):
        with open(path) as f:
            names += [e["name"] for e in read_events(f.read()) if e.get("ph") == "X"]
    assert names.count("gpu_model_runner: vit_forward") >= 1
    assert names.count("mm:hash:image_bytes") + names.count("mm:hash:pil_image") >= 6
