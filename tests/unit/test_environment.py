"""The tiny models' torchvision-free set-up: applied where asked (in-process or through the start-up
folder), never by the plugin; the numpy video processor lays patches out as transformers does."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from mmscope.demo import environment

TWIN = "transformers.models.pixtral.image_processing_pixtral"
PROBE = ("import sys, importlib.util\n"
         "print(any(type(f).__name__ == '_PilTwinFinder' for f in sys.meta_path))\n")


def python(code: str, **env) -> str:
    full = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                          check=True, timeout=120).stdout.strip()


def test_the_plugin_installs_nothing_with_mmscope_disable():
    code = ("import sys\nbefore = list(sys.meta_path)\nfrom mmscope.vllm import plugin\n"
            "plugin.register()\nprint(sys.meta_path == before)\n")
    assert python(code, MMSCOPE_DISABLE="1", PYTHONPATH="") == "True"


def test_the_plugin_installs_no_pil_twins_when_enabled():
    code = "from mmscope.vllm import plugin\nplugin.register()\n" + PROBE
    assert python(code, PYTHONPATH="") == "False"


def test_the_startup_folder_installs_them_in_every_process():
    assert python(PROBE, PYTHONPATH=environment.pythonpath("")) == "True"


@pytest.mark.skipif(environment.torchvision_loads(), reason="the twins serve only without torchvision")
def test_a_twin_serves_the_pil_module_under_the_torchvision_name():
    code = f"import {TWIN} as m\nprint(m.__name__, hasattr(m, '_num_image_tokens'))\n"
    out = python(code, PYTHONPATH=environment.pythonpath(""))
    assert out == "transformers.models.pixtral.image_processing_pil_pixtral True"


def test_pythonpath_puts_the_startup_folder_first_once():
    path = environment.pythonpath(os.pathsep.join(["/a", environment.STARTUP_DIR, "/b"]))
    assert path.split(os.pathsep) == [environment.STARTUP_DIR, "/a", "/b"]


def test_a_later_sitecustomize_still_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['LATER_SITE'] = 'ran'\n")
    code = "import os\nprint(os.environ.get('LATER_SITE'))\n" + PROBE
    assert python(code, PYTHONPATH=environment.pythonpath(str(tmp_path))) == "ran\nTrue"


def test_status_names_the_model_files_or_says_torchvision_loads(monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    status = environment.torchvision_status()
    if environment.torchvision_loads():
        assert status.startswith("torchvision loads")
    else:
        assert "vllm/model_executor/models/pixtral.py" in status
        assert "vllm/model_executor/models/qwen2_vl.py" in status
        assert environment.STARTUP_DIR in status


def test_status_says_the_stand_ins_are_on_pythonpath_when_they_are(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", environment.pythonpath("/elsewhere"))
    status = environment.torchvision_status()
    if not environment.torchvision_loads():
        assert "stand-ins are on PYTHONPATH" in status and "pixtral.py" not in status


def reference_patchify(frames, patch, merge, temporal):
    """transformers' Qwen2VLVideoProcessor.patchify, the torch view/permute, on one video."""
    import torch

    video = torch.from_numpy(frames).permute(0, 3, 1, 2)[None]
    b, t, c, h, w = video.shape
    gt, gh, gw = t // temporal, h // patch, w // patch
    x = video.reshape(b, gt, temporal, c, gh // merge, merge, patch, gw // merge, merge, patch)
    x = x.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    return x.reshape(b, gt * gh * gw, c * temporal * patch * patch)[0].numpy()


def test_video_patches_are_laid_out_as_transformers_lays_them_out():
    from mmscope.demo import inputs
    from mmscope.demo.qwen_video import QwenVideoProcessorNumpy, _patchify

    frames, metadata = inputs.video(3, frames=4, size=(56, 84))  # 84 high, 56 wide
    patches, grid = _patchify(frames.astype(np.float32), 14, 2, 2)
    np.testing.assert_array_equal(patches, reference_patchify(frames.astype(np.float32), 14, 2, 2))
    assert grid == [2, 6, 4]
    processor = QwenVideoProcessorNumpy(size={"shortest_edge": 56 * 56, "longest_edge": 2 * 56 * 84})
    out = processor(frames, video_metadata=metadata, return_metadata=True)
    assert out["pixel_values_videos"].shape == (48, 3 * 2 * 14 * 14)
    assert out["video_grid_thw"].tolist() == [[2, 6, 4]]
    assert processor.get_num_of_video_patches(4, 84, 56) == 48
    assert out["video_metadata"][0].fps == metadata["fps"]


def test_frames_of_another_size_are_resized_to_whole_merged_patches():
    from mmscope.demo import inputs
    from mmscope.demo.qwen_video import QwenVideoProcessorNumpy

    frames, metadata = inputs.video(4, frames=3, size=(60, 60))
    processor = QwenVideoProcessorNumpy(size={"shortest_edge": 56 * 56, "longest_edge": 2 * 56 * 56})
    out = processor([frames], video_metadata=[metadata])
    assert out["video_grid_thw"].tolist() == [[2, 4, 4]]  # 3 frames padded to 4; 60 -> 56 pixels
    assert out["pixel_values_videos"].shape == (32, 3 * 2 * 14 * 14)


def test_a_model_import_that_needs_torchvision_is_logged_with_the_fix():
    """vLLM logs the failed import with its exception (tests/engine/test_readme.py: end to end)."""
    import logging
    import sys

    from mmscope.vllm import import_hint

    try:
        raise RuntimeError("Error raised in subprocess:\n... No module named 'torchvision'")
    except RuntimeError:
        exc_info = sys.exc_info()
    logger = logging.getLogger(import_hint.REGISTRY_LOGGER)
    failed = logger.makeRecord(logger.name, logging.ERROR, __file__, 1,
                               "Error in inspecting model architecture '%s'", ("Llava",), exc_info)
    other = logger.makeRecord(logger.name, logging.ERROR, __file__, 1, "Error in %s", ("x",),
                              (ValueError, ValueError("no"), None))
    hint = import_hint.TorchvisionHint()
    assert hint.filter(failed) and hint.filter(other)
    assert failed.getMessage().startswith("Error in inspecting model architecture 'Llava'\n"
                                          "mmscope: this model file needs torchvision")
    assert environment.STARTUP_DIR in failed.getMessage()
    assert other.getMessage() == "Error in x"
