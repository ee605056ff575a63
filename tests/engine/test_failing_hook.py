"""A plugin hook that raises inside a live server: one warning names it, it turns itself off, vLLM
answers every request as a server without the failure does, and the hook is loud where operators
look: `vllm:mmscope_hook_off` on /metrics, the stats line, `mmscope doctor --url/--log`; the
encoder-cache figures it fed are withdrawn, never left to read as zeros.

The failure comes from the test's side: tests/kit/startup/failing_hook/sitecustomize.py on the server's
PYTHONPATH (EngineCore is a spawned process, and sitecustomize is imported in each of them).
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import threading
import time

import pytest

from tests.kit.server import chat, metrics

pytestmark = pytest.mark.vllm

SITE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "kit", "startup", "failing_hook")
HOOK = "scheduler.allocate"  # the hook that calls EncoderCacheLedger.allocated
# Read from the file, not imported: importing it would break the ledger in this process too.
MESSAGE = re.search(r'MESSAGE = "(.*)"',
                    pathlib.Path(SITE_DIR, "sitecustomize.py").read_text())[1]
WARNING = re.compile(r"mmscope: hook (\S+) raised (\w+): (.*); it is now off and vLLM continues "
                     r"without it")

# New images and repeats of resident ones (local hits).
WORKLOAD = [[1701], [1702], [1701], [1703], [1702], [1704, 1701], [1703]]


@pytest.fixture(scope="module")
def servers(tiny_model, tmp_path_factory, request):
    """(failing, baseline): a server whose allocation hook raises, and the test run's plain one.
    The failing one starts in a thread while the baseline starts, so the two start-ups overlap."""
    from mmscope.demo.serve import VllmServer

    base = tmp_path_factory.mktemp("failing-hook")
    path = os.pathsep.join(filter(None, [SITE_DIR, os.environ.get("PYTHONPATH")]))
    failing = VllmServer(tiny_model, str(base / "vllm.log"),
                         env={"PYTHONPATH": path, "VLLM_LOG_STATS_INTERVAL": "1"})
    started: list[BaseException] = []

    def start():
        try:
            failing.start()
        except BaseException as e:  # noqa: BLE001 - re-raised on the test's thread below
            started.append(e)

    thread = threading.Thread(target=start)
    thread.start()
    try:
        baseline = request.getfixturevalue("traced_server")
    finally:
        thread.join()
    if started:
        failing.stop()
        raise started[0]
    try:
        yield failing, baseline
    finally:
        failing.stop()


def texts(srv) -> list[str]:
    return [chat(srv.url, srv.model, images)["choices"][0]["message"]["content"]
            for images in WORKLOAD]


def hook_warnings(srv) -> list[tuple[str, str, str]]:
    return WARNING.findall(srv.log_text())


OFF_KEY = f"mmscope_hook_off{{feature=accounting,hook={HOOK},process=EngineCore}}"
STATS_LINE_OFF = (f"Encoder cache figures: off (mmscope hook {HOOK} turned itself off after "
                  f"error: RuntimeError: {MESSAGE})")


def test_failing_hook_warns_once_is_loud_where_operators_look_and_vllm_answers_as_without_it(
        servers):
    failing, baseline = servers
    before = metrics(failing.url)
    assert before[OFF_KEY] == 0 and before["encoder_cache_queries"] == 0  # all there, at 0
    failed_texts = texts(failing)

    assert hook_warnings(failing) == [(HOOK, "RuntimeError", MESSAGE)], failing.log_path
    assert failed_texts == texts(baseline)
    assert not hook_warnings(baseline)

    # The engine sends the news with its next stats: the stats line says why the figures are
    # off, /metrics says which hook, and the counts it fed are withdrawn, not zeros.
    deadline = time.monotonic() + 30
    while STATS_LINE_OFF not in failing.log_text() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert STATS_LINE_OFF in failing.log_text(), failing.log_path
    after = metrics(failing.url)
    assert after[OFF_KEY] == 1
    assert not [k for k in after if k.startswith("encoder_cache_")], sorted(after)
    assert "Encoder cache hit rate" not in failing.log_text().split(STATS_LINE_OFF)[-1]
    baseline_metrics = metrics(baseline.url)
    assert baseline_metrics[OFF_KEY] == 0 and baseline_metrics["encoder_cache_hits"] > 0


def test_doctor_names_the_hook_from_the_live_server_and_from_its_log(servers):
    failing, baseline = servers
    texts(failing)  # the module's servers are shared: the failure may not have happened yet
    live = doctor_json("--url", failing.url)
    assert live.returncode == 1
    off = json.loads(live.stdout)["metrics"]["hooks_off"]
    assert [(h["hook"], h["feature"], h["process"]) for h in off] == [
        (HOOK, "accounting", "EngineCore")]
    logged = doctor_json("--log", failing.log_path)
    assert logged.returncode == 1
    log = json.loads(logged.stdout)["log"]
    assert [(h["hook"], h["error"]) for h in log["hooks_off"]] == [
        (HOOK, f"RuntimeError: {MESSAGE}")]
    assert log["workers"] and all(w["runner"].startswith("Model Runner V") for w in log["workers"])
    healthy = doctor_json("--url", baseline.url)
    assert healthy.returncode == 0 and json.loads(healthy.stdout)["metrics"]["hooks_off"] == []


def doctor_json(*args):
    return subprocess.run([sys.executable, "-m", "mmscope.cli", "doctor", "--json", *args],
                          capture_output=True, text=True, timeout=120)
