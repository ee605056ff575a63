"""The size of one embedding in vLLM's encoder cache: an encoder output row is as wide as the
language model's input embeddings, in the model's dtype, as the worker allocates it."""
from __future__ import annotations


def bytes_per_embedding(model_config) -> int:
    import torch

    itemsize = torch.empty((), dtype=model_config.dtype).element_size()
    return model_config.get_inputs_embeds_size() * itemsize
