"""The tests of vLLM 0.34's real code, run in .venv-vllm034 (`make test`'s last step): the
release checked first (in any other environment the run stops and says how to build this one),
then the model runner chosen (tests/kit/vllm034.py) for this process and every process the
tests start, the tiny models' start-up, and the tiny LLaVA built once per test run."""
from __future__ import annotations

import pytest

from tests.kit import vllm034

_missing = vllm034.missing()
if _missing:
    raise pytest.UsageError(_missing)

vllm034.select()


@pytest.fixture(scope="session", autouse=True)
def tiny_model_environment():
    """Without torchvision the tiny LLaVA needs mmscope's PIL twins, here for in-process work;
    PYTHONPATH already brings them to the processes the tests start (vllm034.select)."""
    from mmscope.demo import environment

    environment.install()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    from mmscope.demo import tiny_model

    return tiny_model.build(str(tmp_path_factory.mktemp("tiny-llava")))
