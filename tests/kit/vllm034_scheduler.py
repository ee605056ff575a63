"""vLLM 0.34's real Scheduler and EncoderCacheManager without a model, for exact-count tests of
the encoder-cache accounting, driven as vLLM's own tests/v1/core drive them: a scheduler built
from the engine's configs, requests carrying `MultiModalFeatureSpec`s at given placeholder
positions, and `Driver.step()`, one engine step with a hand-made `ModelRunnerOutput`.

The configs are the tiny LLaVA's (`create_scheduler(model_dir)`): vLLM reads its config and
processor to size the encoder budget; no weights are loaded and no runner exists. The encoder
cache size and compute budget can be set exactly. vLLM loads mmscope's plugin (its entry point)
while it builds the configs, as an engine's start does, so the plugin's hooks see this scheduler.
"""
from __future__ import annotations

from dataclasses import dataclass

SAMPLED_TOKEN_ID = 7  # the token every request "samples": requests end at their max_tokens


def create_scheduler(model: str, *, max_num_seqs: int = 4, max_num_batched_tokens: int = 256,
                     max_model_len: int = 512, block_size: int = 16, num_blocks: int = 1000,
                     enable_prefix_caching: bool = True, enable_chunked_prefill: bool = True,
                     disable_chunked_mm_input: bool = False,
                     encoder_cache_size: int | None = None,
                     encoder_compute_budget: int | None = None):
    """A Scheduler as EngineCore makes one (vllm/v1/engine/core.py), on a KV cache of
    `num_blocks` blocks of `block_size` tokens. `encoder_cache_size` and
    `encoder_compute_budget` (in embeddings) replace what vLLM derives from the model."""
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.core.encoder_cache_manager import EncoderCacheManager
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    # On x86 vLLM 0.34 refuses a config without Triton; the test start-up answers for it
    # (tests/kit/startup/vllm034/sitecustomize.py), as in an engine of either runner.
    vllm_config = EngineArgs(
        model=model, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, block_size=block_size,
        enable_prefix_caching=enable_prefix_caching,
        enable_chunked_prefill=enable_chunked_prefill,
        disable_chunked_mm_input=disable_chunked_mm_input, enforce_eager=True, seed=0,
    ).create_engine_config()
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(
            block_size=block_size, num_kv_heads=1, head_size=32, dtype=torch.float32))])
    scheduler = Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                          structured_output_manager=StructuredOutputManager(vllm_config),
                          block_size=block_size, log_stats=True)
    if encoder_cache_size is not None:
        scheduler.encoder_cache_manager = EncoderCacheManager(cache_size=encoder_cache_size)
    if encoder_compute_budget is not None:
        scheduler.max_num_encoder_input_tokens = encoder_compute_budget
    return scheduler


@dataclass(frozen=True)
class Item:
    """One multimodal item of a prompt: its cache key (vLLM's identifier), where its
    placeholder starts in the prompt and how many embeddings (tokens) it takes."""
    key: str
    offset: int
    length: int
    modality: str = "image"


def make_request(scheduler, request_id: str, num_tokens: int, items: list[Item] = (),
                 max_tokens: int = 4, prompt_token: int = 5):
    """A Request of `num_tokens` prompt tokens (all `prompt_token`, so prompts with the same
    token share prefix-cache blocks) with one MultiModalFeatureSpec per item, hashed into
    blocks as EngineCore does when prefix caching is on."""
    from vllm import SamplingParams
    from vllm.multimodal.inputs import (MultiModalFeatureSpec, MultiModalKwargsItem,
                                        PlaceholderRange)
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    cache_config = scheduler.vllm_config.cache_config
    block_hasher = None
    if cache_config.enable_prefix_caching:
        hash_fn = get_hash_fn_by_name(cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        block_hasher = get_request_block_hasher(scheduler.block_size, hash_fn)
    features = [MultiModalFeatureSpec(data=MultiModalKwargsItem.dummy(), modality=it.modality,
                                      identifier=it.key, mm_hash=it.key,
                                      mm_position=PlaceholderRange(offset=it.offset,
                                                                   length=it.length))
                for it in items]
    return Request(request_id=request_id, prompt_token_ids=[prompt_token] * num_tokens,
                   sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   pooling_params=None, mm_features=features or None,
                   block_hasher=block_hasher)


@dataclass
class Step:
    """What one step scheduled: tokens per request, the items the encoder ran (their indices in
    the request) and the requests that finished in the step before (the runner drops them)."""
    output: object  # vLLM's SchedulerOutput
    num_scheduled_tokens: dict[str, int]
    encoder_inputs: dict[str, list[int]]
    finished: set[str]
    engine_outputs: dict  # update_from_output's EngineCoreOutputs by client, stats and all


class Driver:
    """Runs the scheduler step by step in place of the engine loop: `schedule()`, then the
    output a model would give (one sampled token for each request whose scheduled tokens reach
    the end of its prompt or continue its decode), then `update_from_output()`."""

    def __init__(self, scheduler):
        self.scheduler = scheduler

    def add(self, *requests) -> None:
        for request in requests:
            self.scheduler.add_request(request)

    def step(self) -> Step:
        from vllm.v1.outputs import ModelRunnerOutput

        output = self.scheduler.schedule()
        req_ids = list(output.num_scheduled_tokens)
        # schedule() has advanced each request's computed tokens; a request whose step reaches
        # the end of its tokens (not a prefill chunk) samples one.
        sampled = [[] if self.scheduler.requests[r].is_prefill_chunk else [SAMPLED_TOKEN_ID]
                   for r in req_ids]
        runner_output = ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled)
        engine_outputs = self.scheduler.update_from_output(output, runner_output)
        return Step(output=output, num_scheduled_tokens=dict(output.num_scheduled_tokens),
                    encoder_inputs={r: list(v) for r, v in
                                    output.scheduled_encoder_inputs.items()},
                    finished=set(output.finished_req_ids), engine_outputs=engine_outputs)

    def run(self, max_steps: int = 100) -> list[Step]:
        """Steps while the scheduler has requests, at most `max_steps`, as the engine loop does:
        the last step schedules nothing and tells the runner which requests finished."""
        steps = []
        while self.scheduler.has_requests():
            if len(steps) == max_steps:
                raise AssertionError(f"requests left after {max_steps} steps")
            steps.append(self.step())
        return steps
