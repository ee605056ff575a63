"""vLLM's entry point into mmscope: `register()` runs once in every vLLM process.

vLLM starts EngineCore and workers with spawn on CPU, so this entry point is the only way in.
"""
from __future__ import annotations

import os

from mmscope.flags import flag
from mmscope.log import logger

_registered_pid: int | None = None


def register() -> None:
    """Called by vLLM's `load_general_plugins()`; cheap and idempotent per process."""
    global _registered_pid
    if _registered_pid == os.getpid():
        return
    _registered_pid = os.getpid()
    from mmscope.vllm import import_hint
    from mmscope.vllm.instrumentor import get_instrumentor

    if flag("MMSCOPE_DISABLE"):
        logger.info("mmscope: MMSCOPE_DISABLE is set; no hooks applied")
        return
    import_hint.install()
    try:
        get_instrumentor().instrument()
    except Exception as e:  # noqa: BLE001 - a broken plugin must not stop vLLM from starting
        logger.warning("mmscope: could not instrument vLLM (%s: %s); vLLM runs unobserved",
                       type(e).__name__, e)


def registered() -> bool:
    return _registered_pid == os.getpid()
