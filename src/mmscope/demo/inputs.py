"""Deterministic inputs for the tiny models: distinct images, videos and audio clips per seed.

A distinct seed gives distinct content, so a distinct encoder-cache key.
"""
from __future__ import annotations

import numpy as np

AUDIO_RATE = 16_000  # Qwen2-Audio's rate: vLLM CPU has no resampler installed for any other


def image(i: int, size: tuple[int, int] = (32, 32)):
    from PIL import Image

    rng = np.random.default_rng(i)
    return Image.fromarray(rng.integers(0, 256, (*size[::-1], 3), dtype=np.uint8))


def video(i: int, frames: int = 4, size: tuple[int, int] = (56, 56), fps: float = 2.0):
    """(frames, metadata): Qwen2.5-VL refuses a video without its metadata."""
    rng = np.random.default_rng(10_000 + i)
    array = rng.integers(0, 256, (frames, size[1], size[0], 3), dtype=np.uint8)
    metadata = {"fps": fps, "duration": frames / fps, "total_num_frames": frames,
                "frames_indices": list(range(frames)), "video_backend": "opencv"}
    return array, metadata


def audio(i: int, seconds: float = 0.5):
    """(samples, rate) at 16 kHz."""
    rng = np.random.default_rng(20_000 + i)
    return (rng.standard_normal(int(AUDIO_RATE * seconds)) * 0.1).astype(np.float32), AUDIO_RATE
