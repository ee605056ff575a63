"""Tiny Qwen2.5-VL: a windowed vision tower (32 wide, 2 blocks) and a Qwen2 text model (64 wide,
2 layers) taking images and videos; 56x56 pixels -> 16 patches -> 4 tokens per image or frame pair.

The video processor is mmscope's numpy one (mmscope.demo.qwen_video), installed by
mmscope.demo.environment where torchvision does not load.
"""
from __future__ import annotations

import json
import os

from mmscope.demo import inputs, tokenizer

ARCH = "qwen2_5_vl"
MODALITIES = ("image", "video")
IMAGE_SIZE = 56
VIDEO_FRAMES = 4
PATCH, MERGE, TEMPORAL = 14, 2, 2
IMAGE_TOKENS = (IMAGE_SIZE // PATCH // MERGE) ** 2
VIDEO_TOKENS = VIDEO_FRAMES // TEMPORAL * IMAGE_TOKENS
HIDDEN = 64
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|image_pad|>", "<|video_pad|>"]
IMAGE_PART = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO_PART = "<|vision_start|><|video_pad|><|vision_end|>"
CHAT_TEMPLATE = tokenizer.chat_template(
    "", {"image,image_url,image_pil": IMAGE_PART, "video,video_url": VIDEO_PART})
# Small pixel bounds keep vLLM's profiling run (largest image, longest video) small too.
PIXELS = {"shortest_edge": IMAGE_SIZE * IMAGE_SIZE, "longest_edge": 2 * IMAGE_SIZE * IMAGE_SIZE}
SUMMARY = (f"Qwen2.5-VL, {IMAGE_SIZE}x{IMAGE_SIZE} images -> {IMAGE_TOKENS} tokens, "
           f"{VIDEO_FRAMES}-frame videos -> {VIDEO_TOKENS} tokens")


def build_tokenizer():
    return tokenizer.build(SPECIALS, None, "<|im_end|>", "<|endoftext|>", CHAT_TEMPLATE,
                           extra_special_tokens={"image_token": "<|image_pad|>",
                                                 "video_token": "<|video_pad|>"})


def build_config(tok):
    from transformers import Qwen2_5_VLConfig

    ids = tok.convert_tokens_to_ids
    config = Qwen2_5_VLConfig(
        vision_config={"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                       "patch_size": PATCH, "spatial_merge_size": MERGE,
                       "temporal_patch_size": TEMPORAL, "window_size": 56,
                       "out_hidden_size": HIDDEN, "fullatt_block_indexes": [1]},
        text_config={"vocab_size": tokenizer.VOCAB, "hidden_size": HIDDEN,
                     "intermediate_size": 2 * HIDDEN, "num_hidden_layers": 2,
                     "num_attention_heads": 2,  # head_dim 32: vLLM's CPU attention takes it
                     "num_key_value_heads": 1, "max_position_embeddings": 2048,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                                         "mrope_section": [4, 6, 6]},  # sums to head_dim / 2
                     "bos_token_id": None, "eos_token_id": ids("<|im_end|>"),
                     "pad_token_id": ids("<|endoftext|>")},
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=False)
    config.dtype = "float32"
    return config


def build_into(out_dir: str) -> None:
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok = build_tokenizer()
    Qwen2_5_VLForConditionalGeneration(build_config(tok)).to(torch.float32).save_pretrained(
        out_dir, safe_serialization=True)
    image_processor = Qwen2VLImageProcessorPil(
        size=dict(PIXELS), patch_size=PATCH, merge_size=MERGE, temporal_patch_size=TEMPORAL)
    image_processor.save_pretrained(out_dir)
    # Written by hand: saving a processor object would need the torchvision video processor.
    with open(os.path.join(out_dir, "video_preprocessor_config.json"), "w") as f:
        json.dump({"video_processor_type": "QwenVideoProcessorNumpy", "size": PIXELS,
                   "patch_size": PATCH, "merge_size": MERGE, "temporal_patch_size": TEMPORAL,
                   "do_sample_frames": False}, f, indent=1)
    with open(os.path.join(out_dir, "processor_config.json"), "w") as f:
        json.dump({"processor_class": "Qwen2_5_VLProcessor"}, f)
    with open(os.path.join(out_dir, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE)
    tok.save_pretrained(out_dir)


def prompt(items: list[tuple[str, int]], text: str) -> dict:
    """items: (modality, seed) pairs, images and videos in that order of placeholders."""
    parts = "".join(IMAGE_PART if m == "image" else VIDEO_PART for m, _ in items)
    p = {"prompt": f"user: {parts}{text}\nassistant:"}
    data: dict[str, list] = {}
    for modality, seed in items:
        data.setdefault(modality, []).append(
            inputs.image(seed, (IMAGE_SIZE, IMAGE_SIZE)) if modality == "image"
            else inputs.video(seed, VIDEO_FRAMES, (IMAGE_SIZE, IMAGE_SIZE)))
    if data:
        p["multi_modal_data"] = {m: v[0] if len(v) == 1 else v for m, v in data.items()}
    return p
