"""Tiny Qwen2-Audio: a Whisper-style audio encoder (32 wide, 2 layers) and a Qwen2 text model
(64 wide, 2 layers); 16 kHz audio, a 0.5 s clip -> 12 audio tokens.

The feature extractor pads every clip to Whisper's 30 s window: vLLM 0.32 takes no other length.
"""
from __future__ import annotations

import os

from mmscope.demo import inputs, tokenizer

ARCH = "qwen2_audio"
MODALITIES = ("audio",)
CLIP_S = 0.5
MEL_FRAMES = int(CLIP_S * 100)  # Whisper's 10 ms hop
AUDIO_TOKENS = ((MEL_FRAMES - 1) // 2 + 1 - 2) // 2 + 1  # conv stride 2, then pooling by 2
HIDDEN = 64
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_bos|>", "<|audio_eos|>",
            "<|AUDIO|>"]
AUDIO_PART = "<|audio_bos|><|AUDIO|><|audio_eos|>"
CHAT_TEMPLATE = tokenizer.chat_template("", {"audio,audio_url,input_audio": AUDIO_PART})
SUMMARY = f"Qwen2-Audio, {CLIP_S:g} s clips at 16 kHz -> {AUDIO_TOKENS} audio tokens"


def build_tokenizer():
    return tokenizer.build(SPECIALS, None, "<|im_end|>", "<|endoftext|>", CHAT_TEMPLATE,
                           extra_special_tokens={"audio_token": "<|AUDIO|>",
                                                 "audio_bos_token": "<|audio_bos|>",
                                                 "audio_eos_token": "<|audio_eos|>"})


def build_config(tok):
    from transformers import Qwen2AudioConfig

    ids = tok.convert_tokens_to_ids
    config = Qwen2AudioConfig(
        audio_config={"num_mel_bins": 128, "encoder_layers": 2, "encoder_attention_heads": 2,
                      "encoder_ffn_dim": 64, "d_model": 32},
        text_config={"model_type": "qwen2", "vocab_size": tokenizer.VOCAB, "hidden_size": HIDDEN,
                     "intermediate_size": 2 * HIDDEN, "num_hidden_layers": 2,
                     "num_attention_heads": 2,  # head_dim 32: vLLM's CPU attention takes it
                     "num_key_value_heads": 1, "max_position_embeddings": 2048,
                     "bos_token_id": None, "eos_token_id": ids("<|im_end|>"),
                     "pad_token_id": ids("<|endoftext|>"), "tie_word_embeddings": False},
        audio_token_index=ids("<|AUDIO|>"))
    config.dtype = "float32"
    return config


def _vllm_key(key: str) -> str:
    """transformers 5 writes the text model as `language_model.model.model.*`; vLLM 0.32 loads
    `language_model.model.*`."""
    return key.replace("language_model.model.model.", "language_model.model.", 1)


def build_into(out_dir: str) -> None:
    import torch
    from transformers import Qwen2AudioForConditionalGeneration, Qwen2AudioProcessor, \
        WhisperFeatureExtractor

    from mmscope.demo.weights import rename_weights

    tok = build_tokenizer()
    Qwen2AudioForConditionalGeneration(build_config(tok)).to(torch.float32).save_pretrained(
        out_dir, safe_serialization=True)
    rename_weights(os.path.join(out_dir, "model.safetensors"), _vllm_key)
    features = WhisperFeatureExtractor(feature_size=128, sampling_rate=inputs.AUDIO_RATE)
    Qwen2AudioProcessor(feature_extractor=features, tokenizer=tok,
                        chat_template=CHAT_TEMPLATE).save_pretrained(out_dir)
    tok.save_pretrained(out_dir)


def prompt(items: list[tuple[str, int]], text: str) -> dict:
    """items: (modality, seed) pairs, all audio here."""
    p = {"prompt": "user: " + AUDIO_PART * len(items) + text + "\nassistant:"}
    if items:
        clips = [inputs.audio(i, CLIP_S) for _, i in items]
        p["multi_modal_data"] = {"audio": clips[0] if len(clips) == 1 else clips}
    return p
