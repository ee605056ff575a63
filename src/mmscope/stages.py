"""The catalogue of every range name mmscope emits or reads (docs/design.md §3).

Emitters and the analyzer import these names; no other module spells a range name.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# --- API server (process 0) -------------------------------------------------------------
HASH_PREFIX = "mm:hash:"
PROCESSOR_PREFIX = "mm:processor:"
MEDIA_PREFIX = "mm:media:"
# Before the processor, one item at a time: its bytes (HTTP download, file read, a data URL's
# base64 decode), then bytes to image, video frames or audio samples.
MEDIA_FETCH, MEDIA_DECODE = "fetch", "decode"
MEDIA_SOURCES = ("http", "data_url", "file")
MEDIA_MODALITIES = ("image", "video", "audio")

# Branches of vLLM's MultiModalHasher.serialize_item, one range name each.
HASH_BRANCHES = ("bytes", "str", "number", "pil_image", "image_bytes", "video", "tensor",
                 "ndarray", "pickle")
# vLLM's TimingContext stage names -> our processor stage names.
HF_PROCESSOR = "apply_hf_processor"  # the HF processor's run: what a processor-cache hit spares
PROCESSOR_STAGES = {
    "get_mm_hashes": "get_mm_hashes",
    "get_cache_missing_items": "cache_lookup",
    HF_PROCESSOR: "hf_processor",
    "merge_mm_kwargs": "merge_mm_kwargs",
    "apply_prompt_updates": "prompt_update",
}

# --- worker --------------------------------------------------------------------------------
PREPROCESS = "gpu_model_runner: preprocess"
FORWARD = "gpu_model_runner: forward"
POSTPROCESS = "gpu_model_runner: postprocess"
SAMPLE = "gpu_model_runner: sample"
BOOKKEEP = "gpu_model_runner: bookkeep"
MODEL_RUNNER_OUTPUT = "gpu_model_runner: ModelRunnerOutput"
EC_LOAD = "ec_connector: load"
VIT_FORWARD = "gpu_model_runner: vit_forward"
EC_SAVE = "ec_connector: save"
GATHER_MM_EMBEDDINGS = "gpu_model_runner: gather_mm_embeddings"
EMBED_INPUT_IDS = "gpu_model_runner: embed_input_ids"
PREPARE_MM_INPUTS = "gpu_model_runner: prepare_mm_inputs"
STEP_META_PREFIX = "step_meta: "
# Every step_meta range has its own name (it carries the step's shape): the analyzer's one stage
# for them all.
STEP_META_STAGE = STEP_META_PREFIX.rstrip(": ")

# The disjoint children of `preprocess` (docs/design.md §3).
PREPROCESS_SIBLINGS = (EC_LOAD, VIT_FORWARD, EC_SAVE, GATHER_MM_EMBEDDINGS, EMBED_INPUT_IDS,
                       PREPARE_MM_INPUTS)

# Spellings found in profiles taken with the original vLLM pull request.
ALIASES = {
    "vit_forward": VIT_FORWARD,
    "gather_mm_embeddings": GATHER_MM_EMBEDDINGS,
    "embed_input_ids": EMBED_INPUT_IDS,
    "_prepare_mm_inputs": PREPARE_MM_INPUTS,
    "prepare_mm_inputs": PREPARE_MM_INPUTS,
}


def hash_range(branch: str) -> str:
    return HASH_PREFIX + branch


def media_range(step: str, source: str, modality: str) -> str:
    """`mm:media:<fetch|decode>:<source>:<modality>`: the stage histogram's `stage` label carries
    both, as `mm:hash:<branch>` carries its branch."""
    return f"{MEDIA_PREFIX}{step}:{source}:{modality}"


def parse_media_range(name: str) -> tuple[str, str, str] | None:
    """(step, source, modality) of a media range name, or None."""
    if not name.startswith(MEDIA_PREFIX):
        return None
    parts = name[len(MEDIA_PREFIX):].split(":")
    return tuple(parts) if len(parts) == 3 else None


def media_stages(modalities) -> tuple[str, ...]:
    """The media stages of a model accepting `modalities`: each step, source and modality."""
    return tuple(media_range(step, source, m) for step in (MEDIA_FETCH, MEDIA_DECODE)
                 for source in MEDIA_SOURCES for m in modalities if m in MEDIA_MODALITIES)


def processor_range(vllm_stage: str) -> str:
    """Range name for one of vLLM's TimingContext stages (unknown stages keep their name)."""
    return PROCESSOR_PREFIX + PROCESSOR_STAGES.get(vllm_stage, vllm_stage)


@dataclass(frozen=True)
class StepShape:
    prefill: int
    decode: int
    total: int
    reqs: int


# A %-format of (prefill, decode, total, reqs).
STEP_META_FORMAT = STEP_META_PREFIX + "prefill=%d decode=%d total=%d reqs=%d"


def step_meta_range(shape: StepShape) -> str:
    return STEP_META_FORMAT % (shape.prefill, shape.decode, shape.total, shape.reqs)


# Its parse, also as a pattern for other regex engines (the analyzer parses many names at once).
STEP_META_PATTERN = r"^step_meta: prefill=(\d+) decode=(\d+) total=(\d+) reqs=(\d+)$"
_STEP_META_RE = re.compile(STEP_META_PATTERN)


def parse_step_meta(name: str) -> StepShape | None:
    m = _STEP_META_RE.match(name)
    return StepShape(*map(int, m.groups())) if m else None


def canonical(name: str) -> str:
    """The catalogue name for a range name as found in a profile."""
    return ALIASES.get(name, name)


# Parent of each catalogued range, as the analyzer checks it (None: no required parent).
PARENTS: dict[str, str | None] = {name: PREPROCESS for name in PREPROCESS_SIBLINGS}
PARENTS[PREPROCESS] = None
PARENTS[FORWARD] = None

ALL_FIXED = (PREPROCESS, FORWARD, POSTPROCESS) + PREPROCESS_SIBLINGS

# Every stage the stage timer measures (the `stage` label of vllm:mm_stage_duration_seconds):
# a hash of several items at once is "mixed"; the media stages of the modalities a model
# accepts come with them (media_stages).
TIMED_STAGES = (tuple(hash_range(b) for b in HASH_BRANCHES + ("mixed",))
                + tuple(PROCESSOR_PREFIX + s for s in PROCESSOR_STAGES.values())
                + PREPROCESS_SIBLINGS)

# --- the parts of a multimodal request's time to first token (docs/design.md §4a) -----------
# The `part` label of vllm:request_ttft_part_seconds; they add up to the request's TTFT. The
# first three split the API server's processing (vLLM's arrival until the request leaves it).
TTFT_MEDIA = "media"  # its items fetched and decoded, as wall time (concurrent items count once)
TTFT_RENDER = "render"  # the rest of the API server's processing: chat template, tokens
TTFT_PROCESSOR = "processor"  # the multimodal processor: hashing, cache lookup, HF processor
TTFT_QUEUE = "queue"  # EngineCore: queued until first scheduled
TTFT_ENCODER = "encoder"  # its share of the encoder steps that computed its items
TTFT_EC_LOAD = "ec_load"  # its share of the EC connector loads of its items
TTFT_PREFILL = "prefill"  # first scheduled until first token, less encoder and EC load
TTFT_OTHER = "other"  # hand-offs between processes, output path: what is not attributed
TTFT_API_PARTS = (TTFT_MEDIA, TTFT_RENDER, TTFT_PROCESSOR)
TTFT_PARTS = (*TTFT_API_PARTS, TTFT_QUEUE, TTFT_ENCODER, TTFT_EC_LOAD, TTFT_PREFILL, TTFT_OTHER)
