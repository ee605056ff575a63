"""Tiny-model throughput without mmscope, with mmscope (metrics on, tracing off) and with every
range on (chrome), measured side by side: configurations interleaved in one run (DESIGN §8).

Run: .venv/bin/python bench/plugin_overhead.py [--rounds 3] [--requests 48]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

WORKLOAD = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, os.environ["MMSCOPE_REPO"])
    from mmscope import tiny_model
    from tests.vllm_kit import image, offline_llm, prompt
    from vllm import SamplingParams
    n, reps = int(sys.argv[1]), int(sys.argv[2])
    llm = offline_llm(tiny_model.build(tiny_model.default_dir()), max_num_seqs=16)
    sp = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    # Half the images repeat earlier ones: hits and misses both exercised.
    batch = [prompt([image(i // 2 if i % 2 else 1000 + i)], f"Question {i}?") for i in range(n)]
    llm.generate(batch[:4], sp, use_tqdm=False)  # warm-up
    times = []
    for r in range(reps):
        t = time.perf_counter()
        outs = llm.generate(batch, sp, use_tqdm=False)
        times.append(time.perf_counter() - t)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    print("RESULT " + json.dumps({"seconds": times, "tokens": tokens, "images": n}))
""")

CONFIGS = {
    "without mmscope": {"MMSCOPE_DISABLE": "1"},
    "mmscope, tracing off": {},
    "mmscope, every range (chrome)": {"MMSCOPE_TRACE": "chrome"},
}


def run_once(env_extra: dict, n: int, reps: int, tmp: str) -> dict:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, MMSCOPE_REPO=repo, MMSCOPE_TRACE_DIR=tmp, HF_HUB_OFFLINE="1",
               VLLM_NO_USAGE_STATS="1", **env_extra)
    out = subprocess.run([sys.executable, "-c", WORKLOAD, str(n), str(reps)], env=env,
                         capture_output=True, text=True, check=True)
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[7:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--reps", type=int, default=5, help="timed batches per engine")
    args = ap.parse_args()
    times: dict[str, list[float]] = {name: [] for name in CONFIGS}
    facts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):  # interleaved so drift hits every configuration alike
            for name, env in CONFIGS.items():
                res = run_once(env, args.requests, args.reps, tmp)
                times[name] += res["seconds"]
                facts = res
                print(f"round {r + 1}/{args.rounds}: {name}: median "
                      f"{statistics.median(res['seconds']) * 1000:.1f} ms", file=sys.stderr)
    base = statistics.median(times["without mmscope"])
    print(f"{'configuration':32} {'batch ms':>9} {'tokens/s':>9} {'images/s':>9} {'vs bare':>8}")
    for name, ts in times.items():
        t = statistics.median(ts)
        print(f"{name:32} {t * 1000:9.1f} {facts['tokens'] / t:9.0f} {facts['images'] / t:9.1f} "
              f"{(t / base - 1) * 100:+7.1f}%")
    print(f"(median of {args.rounds} rounds x {args.reps} batches of {args.requests} image "
          f"requests, 16 tokens each; in-process engine)")


if __name__ == "__main__":
    main()
