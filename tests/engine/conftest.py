"""Fixtures of the engine and server tests: the tiny model, built once per session, and one
shared OpenAI server with every range and the probe on."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    from mmscope.demo import tiny_model

    return tiny_model.build(str(tmp_path_factory.mktemp("tiny-llava")))


@pytest.fixture(scope="session")
def traced_server(tiny_model, tmp_path_factory):
    """One OpenAI server for the session with every mmscope range on (MMSCOPE_TRACE=chrome) and
    the probe on (VLLM_MM_CACHE_PROBE=1)."""
    from mmscope.demo.serve import VllmServer

    base = tmp_path_factory.mktemp("traced-server")
    srv = VllmServer(tiny_model, str(base / "vllm.log"),
                     env={"MMSCOPE_TRACE": "chrome", "MMSCOPE_TRACE_DIR": str(base / "traces"),
                          "VLLM_LOG_STATS_INTERVAL": "1", "VLLM_MM_CACHE_PROBE": "1"})
    srv.trace_dir = base / "traces"
    with srv:
        yield srv
