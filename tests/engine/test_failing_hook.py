"""A plugin hook that raises inside a live server: one warning names it, it turns itself off, and
vLLM answers every request as a server without the failure does while the other hooks count on.

The failure comes from the test's side: tests/data/failing_hook/sitecustomize.py on the server's
PYTHONPATH (EngineCore is a spawned process, and sitecustomize is imported in each of them).
"""
from __future__ import annotations

import os
import pathlib
import re
import threading

import pytest

from tests.kit.server import chat, metrics

pytestmark = pytest.mark.vllm

SITE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "data", "failing_hook")
HOOK = "scheduler.allocate"  # the hook that calls EncoderCacheLedger.allocated
# Read from the file, not imported: importing it would break the ledger in this process too.
MESSAGE = re.search(r'MESSAGE = "(.*)"',
                    pathlib.Path(SITE_DIR, "sitecustomize.py").read_text())[1]
WARNING = re.compile(r"mmscope: hook (\S+) raised (\w+): (.*); it is now off and vLLM continues "
                     r"without it")

# New images and repeats of resident ones (local hits). No request carries two copies of one image:
# telling the second copy from a local hit is the failed hook's part.
WORKLOAD = [[1701], [1702], [1701], [1703], [1702], [1704, 1701], [1703]]
LOCAL_REPEATS = 4  # 1701, 1702, 1701 beside 1704, 1703


@pytest.fixture(scope="module")
def servers(tiny_model, tmp_path_factory, request):
    """(failing, baseline): a server whose allocation hook raises, and the session's plain one.
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


def test_failing_hook_warns_once_and_vllm_answers_as_without_it(servers):
    failing, baseline = servers
    before = metrics(failing.url)
    failed_texts = texts(failing)
    after = metrics(failing.url)

    assert hook_warnings(failing) == [(HOOK, "RuntimeError", MESSAGE)], failing.log_path
    assert failed_texts == texts(baseline)

    counted = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    # The other hooks count on: every repeat of a resident image is a local hit.
    assert counted.get("encoder_cache_hits_by_source{source=local}") == LOCAL_REPEATS
    assert counted.get("encoder_cache_hits") == LOCAL_REPEATS
    # The failed hook is off: the items it would have recorded as computed are not counted.
    assert counted.get("encoder_cache_misses", 0.0) == 0
    assert not hook_warnings(baseline)
