"""When vLLM cannot import a model file because torchvision does not load, the error it logs names
the fix: mmscope's torchvision-free stand-ins on PYTHONPATH, or the torchvision of this torch.

A filter on vLLM's model-registry logger appends one sentence to vLLM's own error record.
"""
from __future__ import annotations

import logging
import os
import traceback

REGISTRY_LOGGER = "vllm.model_executor.models.registry"
# The folder whose sitecustomize installs the stand-ins (the demo's; a path, not an import: the
# plugin imports no tool).
STARTUP_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demo",
                           "startup")


def fix() -> str:
    """How to serve a LLaVA or Qwen-VL model where torchvision does not load."""
    return (f"start vLLM with PYTHONPATH={STARTUP_DIR} (mmscope's torchvision-free stand-ins) "
            "or install the torchvision build that matches your torch")


class TorchvisionHint(logging.Filter):
    """vLLM logs the failed import of a model class (in its inspection subprocess or in-process)
    with the exception, whose text holds the subprocess's traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and isinstance(record.msg, str) and _needs_torchvision(exc):
            hint = f"mmscope: this model file needs torchvision, which does not load here; " \
                   f"{fix()}"
            record.msg += "\n" + hint.replace("%", "%%")
        return True


def _needs_torchvision(exc: BaseException) -> bool:
    text = "".join(traceback.format_exception(exc))
    return "No module named 'torchvision'" in text or "torchvision::" in text


def install() -> None:
    target = logging.getLogger(REGISTRY_LOGGER)
    if not any(isinstance(f, TorchvisionHint) for f in target.filters):
        target.addFilter(TorchvisionHint())
