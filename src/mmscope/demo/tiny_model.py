"""Build a tiny LLaVA (CLIP vision tower + Llama text model) directory that vLLM CPU serves.

No network: the tokenizer is a byte-level BPE trained here, the weights are seeded random numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

IMAGE_SIZE = 32  # vision input is 32x32
PATCH = 8  # (32/8)^2 = 16 image tokens per image once CLS is dropped
IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2
VOCAB = 512
HIDDEN = 64
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<image>"]
MARKER = "mmscope-tiny-model.json"  # written last: its presence means the directory is complete

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }}: "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ('image', 'image_url', 'image_pil') %}<image>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

_CORPUS = [
    "user: What is shown in this image? assistant: A cat sitting on a red mat.",
    "Describe the picture in detail. The photo shows a dog, a tree and the sky.",
    "user: assistant: system: hello world, how are you today? I am fine, thanks.",
    "Compare the two images. The first one is blue and the second one is green.",
    "0 1 2 3 4 5 6 7 8 9 . , ! ? : ; ' \" ( ) [ ] { } - + = * / \\ < > _ # @ & %",
]


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - 16, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        pad_token="<pad>", extra_special_tokens={"image_token": "<image>"}, model_max_length=1024)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_config(tokenizer):
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    vision = CLIPVisionConfig(
        hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
        num_attention_heads=2, image_size=IMAGE_SIZE, patch_size=PATCH, projection_dim=HIDDEN)
    text = LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 32: a size vLLM's CPU attention supports
        num_key_value_heads=1, max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    config = LlavaConfig(
        vision_config=vision, text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        projector_hidden_act="gelu", vision_feature_select_strategy="default",
        vision_feature_layer=-1, image_seq_length=IMAGE_TOKENS)
    config.dtype = "float32"
    return config


def _vllm_weight_layout(path: str) -> None:
    """transformers 5 writes the CLIP tower as `vision_tower.*`; vLLM 0.32 loads the llava-hf
    layout `vision_tower.vision_model.*`, so rename the keys in place."""
    from safetensors.torch import load_file, save_file

    renamed = {}
    for key, tensor in load_file(path).items():
        if key.startswith("vision_tower.") and not key.startswith("vision_tower.vision_model."):
            key = "vision_tower.vision_model." + key[len("vision_tower."):]
        renamed[key] = tensor.contiguous()
    save_file(renamed, path, metadata={"format": "pt"})


def build(out_dir: str, seed: int = 0) -> str:
    """Write the model directory (idempotent: an existing complete directory is reused)."""
    out_dir = os.path.abspath(out_dir)
    if is_built(out_dir, seed):
        return out_dir
    import torch
    from transformers import LlavaForConditionalGeneration, LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    torch.manual_seed(seed)
    os.makedirs(out_dir, exist_ok=True)
    tokenizer = build_tokenizer()
    config = build_config(tokenizer)
    model = LlavaForConditionalGeneration(config).to(torch.float32)
    model.save_pretrained(out_dir, safe_serialization=True)
    _vllm_weight_layout(os.path.join(out_dir, "model.safetensors"))
    # The PIL image processor: the default one needs torchvision, which does not load here.
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    LlavaProcessor(
        image_processor=image_processor, tokenizer=tokenizer, patch_size=PATCH,
        vision_feature_select_strategy="default", num_additional_image_tokens=1,
        image_token="<image>", chat_template=CHAT_TEMPLATE).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    with open(os.path.join(out_dir, MARKER), "w") as f:
        json.dump({"seed": seed, "image_tokens": IMAGE_TOKENS, "image_size": IMAGE_SIZE}, f)
    return out_dir


def is_built(out_dir: str, seed: int = 0) -> bool:
    try:
        with open(os.path.join(out_dir, MARKER)) as f:
            return json.load(f).get("seed") == seed
    except (OSError, ValueError):
        return False


def default_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mmscope", "tiny-llava")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", nargs="?", default=None,
                   help=f"output directory (default: {default_dir()})")
    p.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    p.add_argument("--force", action="store_true", help="rebuild even if the directory is complete")


def run(args) -> int:
    from mmscope.errors import UserError

    out = args.dir or default_dir()
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f"{out} exists and is not a directory")
    if args.force and os.path.exists(os.path.join(out, MARKER)):
        os.remove(os.path.join(out, MARKER))
    try:
        path = build(out, args.seed)
    except ImportError as e:
        raise UserError(f"building the model needs torch and transformers ({e}); "
                        "install mmscope[vllm]") from None
    except OSError as e:
        raise UserError(f"cannot write {out}: {e.strerror}") from None
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    print(f"tiny model: {path} ({size / 1e6:.1f} MB; LLaVA, {IMAGE_SIZE}x{IMAGE_SIZE} images -> "
          f"{IMAGE_TOKENS} image tokens)")
    print(f"serve it: python -m vllm.entrypoints.openai.api_server --model {path} "
          "--max-model-len 1024 --enforce-eager")
    return 0


if __name__ == "__main__":
    sys.exit(run(argparse.Namespace(dir=sys.argv[1] if len(sys.argv) > 1 else None, seed=0,
                                    force=False)))
