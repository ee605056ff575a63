"""Tiny LLaVA: a CLIP vision tower (64 wide, 2 layers) and a Llama text model (64 wide, 2 layers).

32x32 images, 8x8 patches: 16 image tokens per image once CLS is dropped.
"""
from __future__ import annotations

import os

from mmscope.demo import inputs, tokenizer

ARCH = "llava"
MODALITIES = ("image",)
IMAGE_SIZE = 32
PATCH = 8
IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2
HIDDEN = 64
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<image>"]
CHAT_TEMPLATE = tokenizer.chat_template(
    "{{ bos_token }}", {"image,image_url,image_pil": "<image>"})
SUMMARY = f"LLaVA, {IMAGE_SIZE}x{IMAGE_SIZE} images -> {IMAGE_TOKENS} image tokens"


def build_tokenizer():
    return tokenizer.build(SPECIALS, "<s>", "</s>", "<pad>", CHAT_TEMPLATE,
                           extra_special_tokens={"image_token": "<image>"})


def build_config(tok):
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    vision = CLIPVisionConfig(
        hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
        num_attention_heads=2, image_size=IMAGE_SIZE, patch_size=PATCH, projection_dim=HIDDEN)
    text = LlamaConfig(
        vocab_size=tokenizer.VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 32: a size vLLM's CPU attention supports
        num_key_value_heads=1, max_position_embeddings=2048,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    config = LlavaConfig(
        vision_config=vision, text_config=text,
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        projector_hidden_act="gelu", vision_feature_select_strategy="default",
        vision_feature_layer=-1, image_seq_length=IMAGE_TOKENS)
    config.dtype = "float32"
    return config


def _vllm_key(key: str) -> str:
    """transformers 5 writes the CLIP tower as `vision_tower.*`; vLLM 0.32 loads the llava-hf
    layout `vision_tower.vision_model.*`."""
    if key.startswith("vision_tower.") and not key.startswith("vision_tower.vision_model."):
        return "vision_tower.vision_model." + key[len("vision_tower."):]
    return key


def build_into(out_dir: str) -> None:
    import torch
    from transformers import LlavaForConditionalGeneration, LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    from mmscope.demo.weights import rename_weights

    tok = build_tokenizer()
    LlavaForConditionalGeneration(build_config(tok)).to(torch.float32).save_pretrained(
        out_dir, safe_serialization=True)
    rename_weights(os.path.join(out_dir, "model.safetensors"), _vllm_key)
    # The PIL image processor: the default one needs torchvision.
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    LlavaProcessor(
        image_processor=image_processor, tokenizer=tok, patch_size=PATCH,
        vision_feature_select_strategy="default", num_additional_image_tokens=1,
        image_token="<image>", chat_template=CHAT_TEMPLATE).save_pretrained(out_dir)
    tok.save_pretrained(out_dir)


def prompt(items: list[tuple[str, int]], text: str) -> dict:
    """items: (modality, seed) pairs, all images here."""
    p = {"prompt": "<s>user: " + "<image>" * len(items) + text + "\nassistant:"}
    if items:
        images = [inputs.image(i, (IMAGE_SIZE, IMAGE_SIZE)) for _, i in items]
        p["multi_modal_data"] = {"image": images[0] if len(images) == 1 else images}
    return p
