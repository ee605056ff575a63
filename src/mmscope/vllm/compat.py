"""Import fixes that vLLM 0.32's LLaVA model file needs when torchvision cannot load.

vLLM's llava.py imports pixtral.py, which takes `_num_image_tokens` from a transformers 5 module that
imports torchvision. The same helper lives in the PIL-backend module, so we serve that one under the
torchvision module's name — only when torchvision is absent, and only for those two modules.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

# torchvision-backed module -> (PIL-backed module, {alias: PIL class})
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
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _PIL_TWINS:
            return None
        return importlib.util.spec_from_loader(fullname, _PilTwinLoader(*_PIL_TWINS[fullname]))


def _torchvision_loads() -> bool:
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        import torchvision  # noqa: F401
        return True
    except Exception:  # noqa: BLE001 - any failure means the PIL twins are needed
        return False


def install_pil_twins() -> bool:
    """Serve the PIL twins when torchvision is missing or broken; True if installed."""
    if any(isinstance(f, _PilTwinFinder) for f in sys.meta_path):
        return True
    if _torchvision_loads():
        return False
    sys.meta_path.insert(0, _PilTwinFinder())
    return True
