"""The workload `mmscope demo` runs in a child process: vLLM CPU, in-process, with the plugin.

Image reuse, several images per request, text-only requests; writes summary.json and prints
`PROGRESS <text>` lines for the parent.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time


def progress(text: str) -> None:
    print(f"PROGRESS {text}", flush=True)


def image(i: int):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(i)
    return Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))


def prompt(images: list[int], text: str) -> dict:
    tags = "<image>" * len(images)
    p = {"prompt": f"<s>user: {tags}{text}\nassistant:"}
    if images:
        imgs = [image(i) for i in images]
        p["multi_modal_data"] = {"image": imgs[0] if len(imgs) == 1 else imgs}
    return p


# (images, text) per request, in three batches: new images, then reuse, then a mix.
ROUNDS = [
    [([1], "What is in this picture?"), ([2], "Describe the image."), ([3, 4], "Compare them."),
     ([], "Hello, how are you?"), ([5], "What colour is it?"), ([6], "Is there a cat?")],
    [([1], "Tell me more."), ([2], "And now?"), ([3], "Which one is this?"),
     ([7, 7], "Twice the same?"), ([], "Thanks!"), ([4], "Again, please.")],
    [([8], "A new one."), ([8], "The same new one, at once."), ([1, 2], "Both old ones."),
     ([], "One more text."), ([5, 9], "Old and new.")],
]


class StepTokens(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.steps, self.prefill, self.decode = 0, 0, 0

    def emit(self, record):
        fields = dict(kv.split("=") for kv in record.getMessage().split()[1:])
        self.steps += 1
        self.prefill += int(fields["prefill"])
        self.decode += int(fields["decode"])


class StatsLine(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        if "Encoder cache hit rate" in str(record.msg):
            self.lines.append(record.getMessage())


def main(out_dir: str, model: str) -> int:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    progress("starting vLLM CPU with the mmscope plugin")
    from vllm import LLM, SamplingParams

    from mmscope.expose import readout

    t0 = time.monotonic()
    llm = LLM(model=model, enforce_eager=True, max_model_len=512, max_num_seqs=8,
              max_num_batched_tokens=256, limit_mm_per_prompt={"image": 2},
              kv_cache_memory_bytes=64 * 2**20, seed=0, disable_log_stats=False)
    progress(f"engine ready in {time.monotonic() - t0:.1f} s")
    steps, stats = StepTokens(), StatsLine()
    step_logger = logging.getLogger("vllm.mmscope.step_tokens")
    step_logger.setLevel(logging.DEBUG)
    step_logger.addHandler(steps)
    logging.getLogger("vllm.v1.metrics.loggers").addHandler(stats)
    sp = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    for n, batch in enumerate(ROUNDS, 1):
        llm.generate([prompt(imgs, text) for imgs, text in batch], sp, use_tqdm=False)
        progress(f"batch {n}/{len(ROUNDS)}: {len(batch)} requests, "
                 f"{sum(len(i) for i, _ in batch)} images")
    llm.llm_engine.do_log_stats()
    summary = {
        "counters": {k: v for k, v in readout.from_vllm_metrics(llm.get_metrics()).items()
                     if k.startswith(("encoder_cache", "mm_cache", "prefix_cache"))},
        "steps": {"steps": steps.steps, "prefill_tokens": steps.prefill,
                  "decode_tokens": steps.decode},
        "stats_line": stats.lines[-1] if stats.lines else None,
        "requests": sum(len(b) for b in ROUNDS),
        "images": sum(len(i) for b in ROUNDS for i, _ in b),
    }
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    progress("workload done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
