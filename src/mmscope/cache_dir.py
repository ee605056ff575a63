"""Where mmscope keeps what it can rebuild (the tiny models, analyses, vLLM's release wheels):
$XDG_CACHE_HOME/mmscope, or ~/.cache/mmscope (XDG: a relative $XDG_CACHE_HOME is ignored).
"""
from __future__ import annotations

import os


def cache_dir(*parts: str) -> str:
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mmscope", *parts)
