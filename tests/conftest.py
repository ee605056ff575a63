"""Shared fixtures: the tiny model (built once per session) and vLLM's environment for tests."""
from __future__ import annotations

import os
import sys

import pytest

# vLLM must never reach a model hub or phone home from tests.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")


@pytest.fixture(params=["c", "python"])
def wrapper_road(request, monkeypatch):
    """mmscope's C wrappers, then its Python ones (patching._native None): they must behave alike.
    On Linux a missing C build fails the test; elsewhere the extension is optional."""
    from mmscope.vllm import patching

    if request.param == "python":
        monkeypatch.setattr(patching, "_native", None)
    elif patching._native is None:
        if sys.platform.startswith("linux"):
            pytest.fail("mmscope.vllm._wrappers is not built (pip install -e . builds it)")
        pytest.skip("the C wrappers are optional off Linux")
    return request.param


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
