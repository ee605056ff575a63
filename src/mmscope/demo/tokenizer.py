"""A byte-level BPE tokenizer trained here on a few sentences, for the tiny models.

No network: every family's special tokens (image, video, audio placeholders) are added to it.
"""
from __future__ import annotations

VOCAB = 512

_CORPUS = [
    "user: What is shown in this image? assistant: A cat sitting on a red mat.",
    "Describe the picture in detail. The photo shows a dog, a tree and the sky.",
    "user: assistant: system: hello world, how are you today? I am fine, thanks.",
    "Compare the two images. The first one is blue and the second one is green.",
    "0 1 2 3 4 5 6 7 8 9 . , ! ? : ; ' \" ( ) [ ] { } - + = * / \\ < > _ # @ & %",
]


def chat_template(bos: str, placeholders: dict[str, str]) -> str:
    """`role: <placeholder per part>text` lines; placeholders maps a part type to its text."""
    parts = "".join(f"{{% elif part['type'] in {tuple(types.split(','))!r} %}}{text}"
                    for types, text in placeholders.items())
    return (
        f"{bos}"
        "{% for message in messages %}"
        "{{ message['role'] }}: "
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for part in message['content'] %}"
        "{% if part['type'] == 'text' %}{{ part['text'] }}"
        f"{parts}"
        "{% endif %}{% endfor %}{% endif %}{{ '\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )


def build(specials: list[str], bos: str | None, eos: str, pad: str, template: str,
          extra_special_tokens: dict[str, str] | None = None):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - 16, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token=specials[0], bos_token=bos, eos_token=eos, pad_token=pad,
        extra_special_tokens=extra_special_tokens or {}, model_max_length=1024)
    fast.chat_template = template
    return fast
