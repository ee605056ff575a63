"""The tiny families' pieces that need no engine: chat templates that put each family's placeholders
where the offline prompts put them, vLLM's weight-key layouts, prompts per modality."""
from __future__ import annotations

import pytest

from mmscope.demo import tiny_llava, tiny_model, tiny_qwen2_5_vl, tiny_qwen2_audio


def render(family, parts):
    tok = family.build_tokenizer()
    return tok.apply_chat_template([{"role": "user", "content": parts}], tokenize=False,
                                   add_generation_prompt=True)


@pytest.mark.parametrize("family, parts, expected", [
    (tiny_llava, [{"type": "image_url"}, {"type": "text", "text": "Hi?"}],
     "<s>user: <image>Hi?\nassistant:"),
    (tiny_qwen2_5_vl, [{"type": "image_url"}, {"type": "video_url"}, {"type": "text", "text": "Hi?"}],
     f"user: {tiny_qwen2_5_vl.IMAGE_PART}{tiny_qwen2_5_vl.VIDEO_PART}Hi?\nassistant:"),
    (tiny_qwen2_audio, [{"type": "input_audio"}, {"type": "text", "text": "Hi?"}],
     f"user: {tiny_qwen2_audio.AUDIO_PART}Hi?\nassistant:"),
])
def test_chat_template_places_the_family_placeholders(family, parts, expected):
    assert render(family, parts) == expected


def test_offline_prompts_match_the_chat_layout():
    p = tiny_qwen2_5_vl.prompt([("image", 1), ("video", 2), ("video", 3)], "Hi?")
    assert p["prompt"] == (f"user: {tiny_qwen2_5_vl.IMAGE_PART}{tiny_qwen2_5_vl.VIDEO_PART * 2}"
                           "Hi?\nassistant:")
    assert p["multi_modal_data"]["image"].size == (56, 56)
    frames, metadata = p["multi_modal_data"]["video"][0]
    assert frames.shape == (4, 56, 56, 3) and metadata["total_num_frames"] == 4
    samples, rate = tiny_qwen2_audio.prompt([("audio", 1)], "Hi?")["multi_modal_data"]["audio"]
    assert rate == 16_000 and len(samples) == 8_000
    assert tiny_llava.prompt([], "Hi?") == {"prompt": "<s>user: Hi?\nassistant:"}


def test_weight_keys_take_vllm_layouts():
    assert tiny_qwen2_audio._vllm_key("language_model.model.model.layers.0.x") == \
        "language_model.model.layers.0.x"
    assert tiny_qwen2_audio._vllm_key("audio_tower.conv1.weight") == "audio_tower.conv1.weight"
    assert tiny_llava._vllm_key("vision_tower.encoder.x") == "vision_tower.vision_model.encoder.x"
    assert tiny_llava._vllm_key("vision_tower.vision_model.x") == "vision_tower.vision_model.x"


def test_audio_tokens_as_the_processor_counts_them():
    from transformers import Qwen2AudioProcessor, WhisperFeatureExtractor

    from mmscope.demo import inputs

    processor = Qwen2AudioProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=128),
                                    tokenizer=tiny_qwen2_audio.build_tokenizer())
    samples, _ = inputs.audio(1, tiny_qwen2_audio.CLIP_S)
    out = processor(text=tiny_qwen2_audio.AUDIO_PART, audio=[samples], sampling_rate=16_000)
    audio_id = processor.tokenizer.convert_tokens_to_ids("<|AUDIO|>")
    assert list(out["input_ids"][0]).count(audio_id) == tiny_qwen2_audio.AUDIO_TOKENS


def test_default_dirs_per_family_and_llava_first(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tiny_model.default_dir() == str(tmp_path / "mmscope" / "tiny-llava")
    assert tiny_model.default_dir("qwen2_5_vl") == str(tmp_path / "mmscope" / "tiny-qwen2-5-vl")
    assert not tiny_model.is_built(str(tmp_path))
