"""Nothing the plugin writes is lost at a normal stop of a real server (docs/design.md §9): vLLM's default
shutdown kills EngineCore without atexit, so the access log and the chrome traces must reach the
disk within about a second while the server runs, and keep every committed record after SIGTERM."""
from __future__ import annotations

import glob
import os
import signal
import time

import pytest

from mmscope.carry import access_log
from mmscope.demo.serve import VllmServer
from mmscope.emit.chrome import read_events
from tests.kit.server import chat, metrics

pytestmark = pytest.mark.vllm


def records(path) -> list:
    return list(access_log.read(str(path))) if os.path.exists(path) else []


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
        while_running = wait_for(lambda: sum(r.kind == "A" for r in records(log))
                                 == counted["encoder_cache_queries"])
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
    accesses = [r for r in records(log) if r.kind == "A"]
    assert len(accesses) == counted["encoder_cache_queries"] == 6
    assert sum(r.outcome == "MISS" for r in accesses) == counted["encoder_cache_misses"] == 4
    assert sum(r.kind == "C" for r in records(log)) >= 1  # the capacity line, at start


def test_the_chrome_traces_are_readable_and_hold_the_stages_after_sigterm(stopped):
    _, traces, counted, _ = stopped
    names = []
    for path in glob.glob(os.path.join(traces, "*.trace.json")):
        with open(path) as f:
            names += [e["name"] for e in read_events(f.read()) if e.get("ph") == "X"]
    assert names.count("gpu_model_runner: vit_forward") >= 1
    assert names.count("mm:hash:image_bytes") + names.count("mm:hash:pil_image") >= 6
