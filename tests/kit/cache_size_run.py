"""Run the cache-size workload (single-image requests with repeats at varying distances) on the tiny
model in-process at one encoder-cache capacity; print the encoder-cache counters as JSON.

Usage (from the repository's root): python -m tests.kit.cache_size_run MODEL_DIR MAX_NUM_BATCHED_TOKENS [--log FILE] [--max-tokens N]
vLLM sets the encoder cache to max_num_batched_tokens embeddings (16 per tiny-model image).
"""
import argparse
import json
import os
import random

from tests.kit.engine import counters, image, offline_llm, prompt

BATCHES, PER_BATCH = 4, 20
DEPTHS = (1, 2, 3, 5, 8)  # stack depth of a repeat: an LRU of k images hits depths <= k


def workload(seed: int = 7) -> list[list[int]]:
    """Image ids per batch: a new image a third of the time, else a repeat at a depth of DEPTHS."""
    rng, recent, ids, fresh = random.Random(seed), [], [], 1000
    for _ in range(BATCHES * PER_BATCH):
        depth = rng.choice(DEPTHS)
        if rng.random() < 0.35 or depth > len(recent):
            pick, fresh = fresh, fresh + 1
        else:
            pick = recent[-depth]
        if pick in recent:
            recent.remove(pick)
        recent.append(pick)
        ids.append(pick)
    return [ids[b * PER_BATCH:(b + 1) * PER_BATCH] for b in range(BATCHES)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("tokens", type=int)
    ap.add_argument("--log")
    ap.add_argument("--max-tokens", type=int, default=2)
    args = ap.parse_args()
    if args.log:
        os.environ["MMSCOPE_ACCESS_LOG"] = args.log  # read when the engine starts
    from vllm import SamplingParams

    llm = offline_llm(args.model, max_num_batched_tokens=args.tokens, enable_chunked_prefill=True,
                      enable_prefix_caching=False)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    n = 0
    for batch in workload():
        prompts = [prompt([image(i)], f"Question {n + k}?") for k, i in enumerate(batch)]
        llm.generate(prompts, params, use_tqdm=False)
        n += len(batch)
    c = counters(llm)
    print("RESULT " + json.dumps({k: v for k, v in c.items() if k.startswith("encoder_cache")}))


if __name__ == "__main__":
    main()
