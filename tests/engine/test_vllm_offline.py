"""The environment works: vLLM CPU runs the tiny model offline with images, plugin loaded."""
from __future__ import annotations

import pytest

from mmscope.demo import tiny_model
from tests.kit.engine import offline_llm

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def llm(tiny_model):
    # vLLM's offline default: no statistics kept.
    return offline_llm(tiny_model, disable_log_stats=True)


def _prompt(image, text="What is this?"):
    return {"prompt": f"<s>user: <image>{text}\nassistant:", "multi_modal_data": {"image": image}}


def test_images_change_the_output_and_runs_are_deterministic(llm):
    from PIL import Image
    from vllm import SamplingParams

    red = Image.new("RGB", (32, 32), (255, 0, 0))
    noise = Image.effect_noise((32, 32), 64).convert("RGB")
    sp = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    first = llm.generate([_prompt(red), _prompt(noise), _prompt(red)], sp, use_tqdm=False)
    again = llm.generate([_prompt(red)], sp, use_tqdm=False)
    ids = [list(o.outputs[0].token_ids) for o in first]
    assert ids[0] != ids[1], "the image must matter for the output"
    assert ids[0] == ids[2] == list(again[0].outputs[0].token_ids)
    # The single <image> placeholder expands to the tower's 16 embeddings.
    image_token = llm.get_tokenizer().convert_tokens_to_ids("<image>")
    assert first[0].prompt_token_ids.count(image_token) == tiny_model.IMAGE_TOKENS


def test_plugin_entry_point_ran_in_the_engine_process(llm):
    from mmscope.vllm import plugin

    assert plugin.registered()
