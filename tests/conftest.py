"""Shared fixtures: the tiny model (built once per session) and vLLM's environment for tests."""
from __future__ import annotations

import os

import pytest

# vLLM must never reach a model hub or phone home from tests.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    from mmscope import tiny_model

    return tiny_model.build(str(tmp_path_factory.mktemp("tiny-llava")))


@pytest.fixture(scope="session")
def traced_server(tiny_model, tmp_path_factory):
    """One OpenAI server for the session with every mmscope range on (MMSCOPE_TRACE=chrome) and
    the probe on (VLLM_MM_CACHE_PROBE=1)."""
    from mmscope.serve import VllmServer

    base = tmp_path_factory.mktemp("traced-server")
    srv = VllmServer(tiny_model, str(base / "vllm.log"),
                     env={"MMSCOPE_TRACE": "chrome", "MMSCOPE_TRACE_DIR": str(base / "traces"),
                          "VLLM_LOG_STATS_INTERVAL": "1", "VLLM_MM_CACHE_PROBE": "1"})
    srv.trace_dir = base / "traces"
    with srv:
        yield srv
