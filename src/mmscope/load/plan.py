"""The workload of one sweep, fixed by a seed: per reuse level, which images each request carries,
which of them repeat an image sent earlier in that level, and a prompt text unique to the request.

Images are synthetic noise (load/images.py) rendered before a level's first request; each level
draws fresh ones, so levels (and runs with other seeds) never share cache entries. The prefix plan (`prefix=True`) instead
repeats whole requests, images first and a long text after them, so that the prefix cache can
cover a repeat's images (vLLM then never looks them up: `vllm:encoder_cache_prefix_covered`).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from mmscope.load.images import Canvas

PROBE_LEVEL = 2**31 - 1  # a level no sweep reaches: the preflight's probe image lives there
# Words of text after the images in the prefix plan: more than a KV block (16 tokens on GPU,
# 128 on CPU) beyond the last image, so the blocks holding the images fill and are cached whole.
PREFIX_WORDS = 120


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    images: tuple[int, ...]  # image numbers within the level, numbered in order of first use
    repeats: tuple[bool, ...]  # per image: was it sent by an earlier request of the level
    text: str
    lane: int = 0  # every sight of an image lies in one lane (shards and instances take lanes)

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

    def part(self, lanes) -> "LevelPlan":
        """The level's requests in `lanes`: their repeats' first sights are theirs too."""
        return LevelPlan(self.level, self.reuse,
                         tuple(r for r in self.requests if r.lane in lanes))


@dataclass
class Workload:
    seed: int
    requests: int
    images_per_request: int
    image_size: tuple[int, int]  # width, height
    levels: tuple[LevelPlan, ...]
    prefix: bool = False  # the prefix plan: whole requests repeated, images before the text
    image_format: str = "png"
    lanes: int = 1
    _canvases: dict[int, Canvas] = field(default_factory=dict, repr=False, compare=False)

    def canvas(self, level: int) -> Canvas:
        """The level's images, each made once and kept until `forget(level)`."""
        if level not in self._canvases:
            self._canvases[level] = Canvas(self.seed, level, self.image_size, self.image_format)
        return self._canvases[level]

    def image_file(self, level: int, image: int) -> bytes:
        return self.canvas(level).file(image)

    def data_url(self, level: int, image: int) -> tuple[bytes, ...]:
        """In the form request bodies take it in (client.Url)."""
        return self.canvas(level).data_url(image)

    def forget(self, level: int) -> None:
        self._canvases.pop(level, None)


def build(seed: int, reuse_levels: list[float], requests: int, images_per_request: int,
          image_size: tuple[int, int], prefix: bool = False, image_format: str = "png",
          lanes: int = 1) -> Workload:
    """Request i lies in lane i mod `lanes`, and repeats only images of its lane; with one lane,
    any earlier image of the level."""
    plan = plan_prefix_level if prefix else plan_level
    levels = tuple(plan(seed, n, reuse, requests, images_per_request, lanes)
                   for n, reuse in enumerate(reuse_levels))
    return Workload(seed, requests, images_per_request, image_size, levels, prefix, image_format,
                    lanes)


def plan_prefix_level(seed: int, level: int, reuse: float, requests: int, per_request: int,
                      lanes: int = 1) -> LevelPlan:
    """A share `reuse` of the level's requests resend an earlier request of their lane whole (its
    images and its long text); the others carry new images only."""
    rng = random.Random(f"mmscope-load-prefix:{seed}:{level}")
    repeats = set(rng.sample(range(lanes, requests),
                             min(int(reuse * requests + 0.5), max(requests - lanes, 0))))
    planned, new = [], 0
    by_lane: list[list[PlannedRequest]] = [[] for _ in range(lanes)]
    for index in range(requests):
        lane = index % lanes
        if index in repeats:
            earlier = by_lane[lane][rng.randrange(len(by_lane[lane]))]
            request = PlannedRequest(index, earlier.images, (True,) * per_request, earlier.text,
                                     lane)
        else:
            images = tuple(range(new, new + per_request))
            new += per_request
            text = prompt_text(seed, level, index) + " " + filler(seed, level, index)
            request = PlannedRequest(index, images, (False,) * per_request, text, lane)
        planned.append(request)
        by_lane[lane].append(request)
    return LevelPlan(level, reuse, tuple(planned))


def filler(seed: int, level: int, index: int) -> str:
    """PREFIX_WORDS words unique to the request (its repeats send it again)."""
    rng = random.Random(f"mmscope-load-words:{seed}:{level}:{index}")
    return " ".join(rng.choice(WORDS) for _ in range(PREFIX_WORDS))


WORDS = ("red", "blue", "green", "cat", "dog", "tree", "house", "river", "cloud", "stone",
         "light", "shadow", "window", "road", "field", "bird")


def plan_level(seed: int, level: int, reuse: float, requests: int, per_request: int,
               lanes: int = 1) -> LevelPlan:
    rng = random.Random(f"mmscope-load:{seed}:{level}")
    planned, new = [], 0
    shown: list[list[int]] = [[] for _ in range(lanes)]  # each lane's images so far
    for index, n_repeat in enumerate(repeat_counts(rng, reuse, requests, per_request, lanes)):
        lane = index % lanes
        slots = [True] * n_repeat + [False] * (per_request - n_repeat)
        rng.shuffle(slots)
        # Distinct earlier images where possible: a request never repeats within itself.
        earlier = rng.sample(shown[lane], n_repeat)
        images = []
        for is_repeat in slots:
            images.append(earlier.pop() if is_repeat else new)
            new += not is_repeat
        shown[lane] += [i for i, r in zip(images, slots) if not r]
        planned.append(PlannedRequest(index, tuple(images), tuple(slots),
                                      prompt_text(seed, level, index), lane))
    return LevelPlan(level, reuse, tuple(planned))


def max_repeats(requests: int, per_request: int, lanes: int = 1) -> int:
    """The first request of each lane has nothing to repeat."""
    return max(requests - lanes, 0) * per_request


def repeat_counts(rng: random.Random, reuse: float, requests: int, per_request: int,
                  lanes: int = 1) -> list[int]:
    """Repeats per request. They are packed into whole requests where the share allows, so that
    the level has requests whose images are all repeats (their time to first token is the point)."""
    total = min(int(reuse * requests * per_request + 0.5),
                max_repeats(requests, per_request, lanes))
    full, partial = divmod(total, per_request)
    chosen = rng.sample(range(lanes, requests), full + (partial > 0))
    counts = [0] * requests
    for n, index in enumerate(chosen):
        counts[index] = per_request if n < full else partial
    return counts


def prompt_text(seed: int, level: int, index: int) -> str:
    """Unique per request, and sent before the images, so no prefix-cache hit can cover an image
    and skip its encoder-cache lookup."""
    return f"Request {index} of level {level} (seed {seed}): what do these images show?"
