"""What mmscope's tiny models need from the Python environment when torchvision does not load:
PIL twins of two transformers modules, and a numpy video processor for Qwen2-VL and Qwen2.5-VL.

In-process engines call `install()` before `LLM()`; vLLM starts its engine processes with spawn, so
a server gets the same through `startup/sitecustomize.py`, the folder `pythonpath()` names.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys

import wrapt

from mmscope.vllm.import_hint import STARTUP_DIR, fix


# torchvision-backed module -> (PIL-backed module, {alias: PIL class}); vLLM 0.32's model files
# that import each, for `torchvision_status()`.
_PIL_TWINS = {
    "transformers.models.pixtral.image_processing_pixtral": (
        "transformers.models.pixtral.image_processing_pil_pixtral",
        {"PixtralImageProcessor": "PixtralImageProcessorPil"},
    ),
    "transformers.models.qwen2_vl.image_processing_qwen2_vl": (
        "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl",
        {"Qwen2VLImageProcessor": "Qwen2VLImageProcessorPil"},
    ),
}
_NEEDED_BY = {
    "transformers.models.pixtral.image_processing_pixtral":
        "vllm/model_executor/models/pixtral.py (imported by llava.py)",
    "transformers.models.qwen2_vl.image_processing_qwen2_vl":
        "vllm/model_executor/models/qwen2_vl.py (imported by qwen2_5_vl.py and others)",
}


class _PilTwinLoader(importlib.abc.Loader):
    def __init__(self, target: str, aliases: dict[str, str]):
        self.target, self.aliases = target, aliases

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        for alias, cls in self.aliases.items():
            if not hasattr(module, alias) and hasattr(module, cls):
                setattr(module, alias, getattr(module, cls))
        return module

    def exec_module(self, module):
        pass


class _PilTwinFinder(importlib.abc.MetaPathFinder):
    """Decides when a twin is asked for, not at start-up: importing torchvision imports torch,
    too slow for every Python process that inherits the start-up folder."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _PIL_TWINS or torchvision_loads():
            return None
        return importlib.util.spec_from_loader(fullname, _PilTwinLoader(*_PIL_TWINS[fullname]))


def torchvision_loads() -> bool:
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        import torchvision  # noqa: F401
        return True
    except Exception:  # noqa: BLE001 - any failure to load means the twins are needed
        return False


def _register_video_processor(_module) -> None:
    if torchvision_loads():
        return
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig
    from transformers.models.auto.video_processing_auto import AutoVideoProcessor
    from transformers.video_processing_utils import VideoProcessorMixin

    from mmscope.demo.qwen_video import QwenVideoProcessorNumpy

    # The hook receives the module transformers' __init__ ran in; the lazy module that replaced
    # it in sys.modules is what `import transformers` gives everyone else.
    transformers = sys.modules["transformers"]

    # ProcessorMixin type-checks a video processor against `transformers.VideoProcessorMixin`,
    # a public name that transformers' lazy module lists only when torchvision is installed
    # although the class itself needs none; no registry reaches that check.
    if not hasattr(transformers, "VideoProcessorMixin"):
        transformers.VideoProcessorMixin = VideoProcessorMixin
    for config in (Qwen2VLConfig, Qwen2_5_VLConfig):
        AutoVideoProcessor.register(config, QwenVideoProcessorNumpy, exist_ok=True)


def install() -> None:
    """Idempotent and cheap: the work happens when transformers or a twin is imported."""
    if any(isinstance(f, _PilTwinFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _PilTwinFinder())
    wrapt.register_post_import_hook(_register_video_processor, "transformers")


def pythonpath(current: str | None = None) -> str:
    """PYTHONPATH with the start-up folder first, for a server or any process tree it starts."""
    parts = [p for p in (current or "").split(os.pathsep) if p and p != STARTUP_DIR]
    return os.pathsep.join([STARTUP_DIR, *parts])


def server_environment(current_pythonpath: str | None = None) -> dict[str, str]:
    """What every process of a vLLM CPU serving a tiny model needs (`mmscope tiny-model --env`,
    the demo, the tests' servers): the start-up folder (the stand-ins decide per import whether
    torchvision loads) and a KV cache of 1 GiB instead of vLLM CPU's 6."""
    return {"PYTHONPATH": pythonpath(current_pythonpath), "VLLM_CPU_KVCACHE_SPACE": "1"}


def torchvision_status() -> str:
    """One paragraph for `mmscope doctor`."""
    if torchvision_loads():
        return "torchvision loads: vLLM's LLaVA and Qwen-VL model files import as they are."
    if STARTUP_DIR in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        return ("torchvision does not load; mmscope's torchvision-free stand-ins are on "
                "PYTHONPATH, so vLLM's LLaVA and Qwen-VL model files import in the processes "
                "started from here.")
    needed = "; ".join(f"{m} for {_NEEDED_BY[m]}" for m in _PIL_TWINS)
    return ("torchvision does not load: vLLM's LLaVA and Qwen2-VL/Qwen2.5-VL model files fail to "
            f"import without PIL twins of {needed}, and Qwen-VL needs a video processor without "
            "torchvision. mmscope's tiny models and demo install both; to serve such a model "
            f"yourself, {fix()}.")
