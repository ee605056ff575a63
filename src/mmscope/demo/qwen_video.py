"""A numpy/PIL video processor for Qwen2-VL and Qwen2.5-VL, for when torchvision does not load.

transformers 5.19 ships only a torchvision-backed one; this resizes, normalises and patchifies the
same way and returns the same `pixel_values_videos` and `video_grid_thw`.
"""
from __future__ import annotations

import numpy as np
from PIL import Image
from transformers.image_processing_utils import BatchFeature
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, ChannelDimension, \
    infer_channel_dimension_format
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
from transformers.processing_utils import VideosKwargs
from transformers.video_processing_utils import VideoProcessorMixin
from transformers.video_utils import make_batched_metadata, make_batched_videos


class QwenVideoKwargs(VideosKwargs, total=False):
    min_pixels: int
    max_pixels: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    min_frames: int
    max_frames: int
    cap_pixels_per_frame: bool
    max_video_tokens: int


class QwenVideoProcessorNumpy(VideoProcessorMixin):
    """Frames arrive decoded and sampled by vLLM, so this neither decodes nor samples."""

    size = {"shortest_edge": 128 * 28 * 28, "longest_edge": 28 * 28 * 768}
    image_mean = OPENAI_CLIP_MEAN
    image_std = OPENAI_CLIP_STD
    patch_size = 14
    temporal_patch_size = 2
    merge_size = 2
    valid_kwargs = QwenVideoKwargs
    model_input_names = ["pixel_values_videos", "video_grid_thw"]

    def preprocess(self, videos, video_metadata=None, return_metadata=False, return_tensors=None,
                   **kwargs) -> BatchFeature:
        videos = make_batched_videos(videos)
        metadata = make_batched_metadata(videos, video_metadata=video_metadata)
        patch = kwargs.get("patch_size") or self.patch_size
        merge = kwargs.get("merge_size") or self.merge_size
        temporal = kwargs.get("temporal_patch_size") or self.temporal_patch_size
        size = kwargs.get("size") or self.size
        flat, grids = [], []
        for video in videos:
            frames = self._normalised(self._resized(_frames_last(video), size, patch * merge))
            patches, grid = _patchify(frames, patch, merge, temporal)
            flat.append(patches)
            grids.append(grid)
        data = {"pixel_values_videos": np.concatenate(flat), "video_grid_thw": np.array(grids)}
        out = BatchFeature(data=data, tensor_type=return_tensors)
        if return_metadata:
            out["video_metadata"] = metadata
        return out

    def _resized(self, frames: np.ndarray, size, factor: int) -> np.ndarray:
        height, width = frames.shape[1:3]
        h, w = smart_resize(height, width, factor, min_pixels=size["shortest_edge"],
                            max_pixels=size["longest_edge"])
        if (h, w) == (height, width):
            return frames
        return np.stack([np.asarray(Image.fromarray(f).resize((w, h), Image.BICUBIC))
                         for f in frames])

    def _normalised(self, frames: np.ndarray) -> np.ndarray:
        scaled = frames.astype(np.float32) / 255.0
        mean, std = np.array(self.image_mean, np.float32), np.array(self.image_std, np.float32)
        return (scaled - mean) / std

    def get_num_of_video_patches(self, num_frames: int, height: int, width: int,
                                 videos_kwargs=None) -> int:
        kwargs = videos_kwargs or {}
        size = kwargs.get("size") or self.size
        patch = kwargs.get("patch_size") or self.patch_size
        merge = kwargs.get("merge_size") or self.merge_size
        temporal = kwargs.get("temporal_patch_size") or self.temporal_patch_size
        h, w = smart_resize(height, width, patch * merge, min_pixels=size["shortest_edge"],
                            max_pixels=size["longest_edge"])
        return (num_frames + -num_frames % temporal) // temporal * (h // patch) * (w // patch)


def _frames_last(video) -> np.ndarray:
    """(frames, height, width, 3) uint8, whatever layout the frames came in."""
    video = np.asarray(video)
    if infer_channel_dimension_format(video[0]) == ChannelDimension.FIRST:
        video = video.transpose(0, 2, 3, 1)
    if video.dtype != np.uint8:
        video = np.clip(video, 0, 255).astype(np.uint8)
    return video


def _patchify(frames: np.ndarray, patch: int, merge: int, temporal: int):
    """The torchvision processor's layout: (grid_t*grid_h*grid_w, 3*temporal*patch*patch)."""
    if pad := -len(frames) % temporal:
        frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)])
    t, h, w, c = frames.shape
    gt, gh, gw = t // temporal, h // patch, w // patch
    x = frames.transpose(0, 3, 1, 2).reshape(
        gt, temporal, c, gh // merge, merge, patch, gw // merge, merge, patch)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gt * gh * gw, c * temporal * patch * patch), [gt, gh, gw]
