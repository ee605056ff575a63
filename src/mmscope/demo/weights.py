"""The tiny models' weights in the layouts vLLM's model files load: a saved safetensors file with
its keys renamed.
"""
from __future__ import annotations


def rename_weights(path: str, rename) -> None:
    """Rewrite a safetensors file with each key passed through `rename` (vLLM's layouts)."""
    from safetensors.torch import load_file, save_file

    renamed = {rename(key): tensor.contiguous() for key, tensor in load_file(path).items()}
    save_file(renamed, path, metadata={"format": "pt"})
