"""The workload of one sweep, fixed by a seed: per reuse level, which images each request carries,
which of them repeat an image sent earlier in that level, and a prompt text unique to the request.

Images are synthetic noise rendered to PNG (or JPEG) on demand; each level draws fresh ones, so
levels (and runs with other seeds) never share cache entries. The prefix plan (`prefix=True`) instead
repeats whole requests, images first and a long text after them, so that the prefix cache can
cover a repeat's images (vLLM then never looks them up: `vllm:encoder_cache_prefix_covered`).
"""
from __future__ import annotations

import base64
import io
import random
from dataclasses import dataclass, field

# Mixed into every pixel seed so our images never coincide with other numpy-seeded images.
PIXEL_DOMAIN = 0x6D6D6C64  # "mmld"
PROBE_LEVEL = 2**31 - 1  # a level no sweep reaches: the preflight's probe image lives there
# Words of text after the images in the prefix plan: more than a KV block (16 tokens on GPU,
# 128 on CPU) beyond the last image, so the blocks holding the images fill and are cached whole.
PREFIX_WORDS = 120
IMAGE_FORMATS = {"png": "image/png", "jpeg": "image/jpeg"}  # --media-format -> content type


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    images: tuple[int, ...]  # image numbers within the level, numbered in order of first use
    repeats: tuple[bool, ...]  # per image: was it sent by an earlier request of the level
    text: str

    @property
    def all_repeats(self) -> bool:
        return all(self.repeats)


@dataclass(frozen=True)
class LevelPlan:
    level: int  # position in the sweep; part of every image's identity
    reuse: float
    requests: tuple[PlannedRequest, ...]

    @property
    def images(self) -> int:
        return sum(len(r.images) for r in self.requests)

    @property
    def planned_hits(self) -> int:
        """Repeats: the hits an encoder cache that never evicts would give."""
        return sum(sum(r.repeats) for r in self.requests)

    @property
    def distinct(self) -> int:
        return self.images - self.planned_hits


@dataclass
class Workload:
    seed: int
    requests: int
    images_per_request: int
    image_size: tuple[int, int]  # width, height
    levels: tuple[LevelPlan, ...]
    prefix: bool = False  # the prefix plan: whole requests repeated, images before the text
    image_format: str = "png"
    _files: dict[tuple[int, int], bytes] = field(default_factory=dict, repr=False, compare=False)
    _urls: dict[tuple[int, int], str] = field(default_factory=dict, repr=False, compare=False)

    def image_file(self, level: int, image: int) -> bytes:
        """An image's file in `image_format`, rendered once and kept until `forget(level)`."""
        key = (level, image)
        if key not in self._files:
            self._files[key] = image_file(self.seed, level, image, self.image_size,
                                          self.image_format)
        return self._files[key]

    def data_url(self, level: int, image: int) -> str:
        """The image's data URL, made once and kept until `forget(level)`."""
        key = (level, image)
        if key not in self._urls:
            self._urls[key] = (f"data:{IMAGE_FORMATS[self.image_format]};base64,"
                               + base64.b64encode(self.image_file(level, image)).decode())
        return self._urls[key]

    def forget(self, level: int) -> None:
        for kept in (self._files, self._urls):
            for key in [k for k in kept if k[0] == level]:
                del kept[key]


def build(seed: int, reuse_levels: list[float], requests: int, images_per_request: int,
          image_size: tuple[int, int], prefix: bool = False, image_format: str = "png") -> Workload:
    plan = plan_prefix_level if prefix else plan_level
    levels = tuple(plan(seed, n, reuse, requests, images_per_request)
                   for n, reuse in enumerate(reuse_levels))
    return Workload(seed, requests, images_per_request, image_size, levels, prefix, image_format)


def plan_prefix_level(seed: int, level: int, reuse: float, requests: int,
                      per_request: int) -> LevelPlan:
    """A share `reuse` of the level's requests resend an earlier request whole (its images and
    its long text); the others carry new images only."""
    rng = random.Random(f"mmscope-load-prefix:{seed}:{level}")
    repeats = set(rng.sample(range(1, requests), min(int(reuse * requests + 0.5), requests - 1)))
    planned, new = [], 0
    for index in range(requests):
        if index in repeats:
            earlier = planned[rng.randrange(len(planned))]
            planned.append(PlannedRequest(index, earlier.images, (True,) * per_request,
                                          earlier.text))
            continue
        images = tuple(range(new, new + per_request))
        new += per_request
        text = prompt_text(seed, level, index) + " " + filler(seed, level, index)
        planned.append(PlannedRequest(index, images, (False,) * per_request, text))
    return LevelPlan(level, reuse, tuple(planned))


def filler(seed: int, level: int, index: int) -> str:
    """PREFIX_WORDS words unique to the request (its repeats send it again)."""
    rng = random.Random(f"mmscope-load-words:{seed}:{level}:{index}")
    return " ".join(rng.choice(WORDS) for _ in range(PREFIX_WORDS))


WORDS = ("red", "blue", "green", "cat", "dog", "tree", "house", "river", "cloud", "stone",
         "light", "shadow", "window", "road", "field", "bird")


def plan_level(seed: int, level: int, reuse: float, requests: int, per_request: int) -> LevelPlan:
    rng = random.Random(f"mmscope-load:{seed}:{level}")
    planned, new = [], 0
    for index, n_repeat in enumerate(repeat_counts(rng, reuse, requests, per_request)):
        slots = [True] * n_repeat + [False] * (per_request - n_repeat)
        rng.shuffle(slots)
        # Distinct earlier images where possible: a request never repeats within itself.
        earlier = rng.sample(range(new), n_repeat)
        images = []
        for is_repeat in slots:
            images.append(earlier.pop() if is_repeat else new)
            new += not is_repeat
        planned.append(PlannedRequest(index, tuple(images), tuple(slots),
                                      prompt_text(seed, level, index)))
    return LevelPlan(level, reuse, tuple(planned))


def max_repeats(requests: int, per_request: int) -> int:
    """The first request of a level has nothing to repeat."""
    return (requests - 1) * per_request


def repeat_counts(rng: random.Random, reuse: float, requests: int, per_request: int) -> list[int]:
    """Repeats per request. They are packed into whole requests where the share allows, so that
    the level has requests whose images are all repeats (their time to first token is the point)."""
    total = min(int(reuse * requests * per_request + 0.5), max_repeats(requests, per_request))
    full, partial = divmod(total, per_request)
    chosen = rng.sample(range(1, requests), full + (partial > 0))
    counts = [0] * requests
    for n, index in enumerate(chosen):
        counts[index] = per_request if n < full else partial
    return counts


def prompt_text(seed: int, level: int, index: int) -> str:
    """Unique per request, and sent before the images, so no prefix-cache hit can cover an image
    and skip its encoder-cache lookup."""
    return f"Request {index} of level {level} (seed {seed}): what do these images show?"


def image_file(seed: int, level: int, image: int, size: tuple[int, int], fmt: str) -> bytes:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng([PIXEL_DOMAIN, seed, level, image])
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    # Noise does not compress; the fastest PNG level keeps rendering cheap.
    options = {"compress_level": 1} if fmt == "png" else {"quality": 90}
    Image.fromarray(pixels).save(buf, format=fmt.upper(), **options)
    return buf.getvalue()
