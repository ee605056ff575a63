"""Fixtures of the engine and server tests: the tiny models' environment in this process and in
every process the tests start, the tiny LLaVA built once per test run, and one shared OpenAI server
with every range and the probe on."""
from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def tiny_model_environment():
    """Without torchvision the tiny models need mmscope's PIL twins and video processor: here for
    in-process engines, through PYTHONPATH for the servers and scripts the tests start. The
    opt-in TTFT split is on for every engine and server the tests start, so that each is checked
    with it (tests/unit/test_metrics.py checks it off)."""
    from mmscope.carry import ttft_split
    from mmscope.demo import environment

    environment.install()
    patch = pytest.MonkeyPatch()
    patch.setenv("PYTHONPATH", environment.pythonpath(os.environ.get("PYTHONPATH")))
    patch.setenv(ttft_split.ENV, "1")
    yield
    patch.undo()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    from mmscope.demo import tiny_model

    return tiny_model.build(str(tmp_path_factory.mktemp("tiny-llava")))


@pytest.fixture(scope="session")
def otlp_receiver():
    """The OTLP/gRPC receiver of the test run's servers that export vLLM's request spans."""
    from tests.kit.otlp import Receiver

    with Receiver() as receiver:
        yield receiver


@pytest.fixture(scope="session")
def traced_server(tiny_model, tmp_path_factory, otlp_receiver):
    """One OpenAI server for the test run with every mmscope range on (MMSCOPE_TRACE=chrome), the
    probe on (VLLM_MM_CACHE_PROBE=1) and vLLM's request spans exported to `otlp_receiver`."""
    from mmscope.demo.serve import VllmServer
    from tests.kit import otlp

    base = tmp_path_factory.mktemp("traced-server")
    srv = VllmServer(tiny_model, str(base / "vllm.log"), extra_args=otlp.server_args(otlp_receiver),
                     env={"MMSCOPE_TRACE": "chrome", "MMSCOPE_TRACE_DIR": str(base / "traces"),
                          "VLLM_LOG_STATS_INTERVAL": "1", "VLLM_MM_CACHE_PROBE": "1",
                          **otlp.SERVER_ENV})
    srv.trace_dir = base / "traces"
    with srv:
        yield srv
