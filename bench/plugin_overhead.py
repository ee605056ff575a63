"""Tiny-model throughput without mmscope, with mmscope (metrics on, tracing off) and with every
range on (chrome), measured side by side in one engine: mmscope's hooks are reverted and re-applied
between batches (uninstrument/instrument), so every configuration runs on the same process, cores
and memory, interleaved (DESIGN §8).

Run: .venv/bin/python bench/plugin_overhead.py [--rounds 12] [--requests 48] [--by-feature]
"""
from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def configurations(by_feature: bool) -> dict[str, tuple[str | None, str]]:
    """name -> (feature left out, or None for all hooks / "all" for none; tracing spec)."""
    configs = {"without mmscope": ("all", "off"),
               "mmscope, tracing off": (None, "off"),
               "mmscope, every range (chrome)": (None, "chrome")}
    if by_feature:
        for feature in ("accounting", "metrics", "ranges", "telemetry"):
            configs[f"tracing off, without {feature}"] = (feature, "off")
    return configs


def apply(instrumentor, left_out: str | None, spec: str, trace_dir: str) -> None:
    import vllm.v1.utils as vutils

    from mmscope import tracing
    from mmscope.vllm import ranges

    instrumentor.uninstrument()
    tracing.configure(spec, trace_dir)
    vutils._PROFILER_FUNC = None  # vLLM re-reads its choice; ours comes back with instrument()
    if left_out == "all":
        return
    instrumentor.instrument()
    for hook in instrumentor.hooks:
        if hook.feature == left_out:
            hook.revert()
    ranges.route_vllm_ranges()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--by-feature", action="store_true",
                    help="also time mmscope with one feature's hooks left out")
    args = ap.parse_args()

    from vllm import SamplingParams

    from mmscope import tiny_model
    from mmscope.vllm.instrumentor import get_instrumentor
    from tests.vllm_kit import image, offline_llm, prompt

    llm = offline_llm(tiny_model.build(tiny_model.default_dir()), max_num_seqs=16)
    sp = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    # Half the images repeat earlier ones: hits and misses both exercised. Fresh images per
    # round so each round computes the same encoder work.
    configs = configurations(args.by_feature)
    instrumentor = get_instrumentor()
    times: dict[str, list[float]] = {name: [] for name in configs}
    tokens = 0
    with tempfile.TemporaryDirectory() as trace_dir:
        llm.generate([prompt([image(1)], "warm-up")] * 4, sp, use_tqdm=False)
        order = list(enumerate(configs.items()))
        for r in range(args.rounds):
            # A new order every round: no configuration always follows the same one.
            random.Random(r).shuffle(order)
            for c, (name, (left_out, spec)) in order:
                base = 100_000 * (r * len(configs) + c + 1)
                batch = [prompt([image(base + (i // 2 if i % 2 else i))], f"Question {i}?")
                         for i in range(args.requests)]
                apply(instrumentor, left_out, spec, trace_dir)
                gc.collect()  # no collection debt carried from one configuration to the next
                t = time.perf_counter()
                outs = llm.generate(batch, sp, use_tqdm=False)
                times[name].append(time.perf_counter() - t)
                tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
        apply(instrumentor, None, "off", trace_dir)
    base_t = statistics.median(times["without mmscope"])
    print(f"{'configuration':36} {'batch ms':>9} {'tokens/s':>9} {'images/s':>9} {'vs bare':>8}")
    for name, ts in times.items():
        t = statistics.median(ts)
        print(f"{name:36} {t * 1000:9.1f} {tokens / t:9.0f} {args.requests / t:9.1f} "
              f"{(t / base_t - 1) * 100:+7.1f}%")
    print(f"(median of {args.rounds} interleaved rounds; each a batch of {args.requests} image "
          f"requests, 16 tokens each; one in-process engine)")


if __name__ == "__main__":
    main()
