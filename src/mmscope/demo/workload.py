"""The workload `mmscope demo` runs in a child process: vLLM CPU, in-process, with the plugin
(the tiny model's environment comes with the process: `environment.server_environment`).

Per model family, a scripted sequence of reuse, several items per request and text-only requests;
writes summary.json and the engine's /metrics page (metrics.txt), and prints `PROGRESS <text>`
lines for the parent.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time

I, V, A = "image", "video", "audio"

# (items, text) per request, in three batches: new items, then only repeats (prefill steps the
# encoder cache spares: the analyzer's like-for-like benefit compares them with the first
# batch's), then a mix. An item is (modality, seed); the same pair is the same content, so the
# same encoder-cache key.
ROUNDS = {
    "llava": [
        [([(I, 1)], "What is in this picture?"), ([(I, 2)], "Describe the image."),
         ([(I, 3), (I, 4)], "Compare them."), ([], "Hello, how are you?"),
         ([(I, 5)], "What colour is it?"), ([(I, 6)], "Is there a cat?")],
        [([(I, 1)], "Tell me more."), ([(I, 2)], "And now?"), ([(I, 3)], "Which one is this?"),
         ([], "Thanks!"), ([(I, 4)], "Again, please.")],
        [([(I, 8)], "A new one."), ([(I, 8)], "The same new one, at once."),
         ([(I, 1), (I, 2)], "Both old ones."), ([], "One more text."),
         ([(I, 5), (I, 9)], "Old and new."), ([(I, 7), (I, 7)], "Twice the same?")],
    ],
    "qwen2_5_vl": [
        [([(V, 1)], "What happens?"), ([(I, 1)], "Describe the image."),
         ([(I, 2), (V, 2)], "The picture and the clip."), ([], "Hello, how are you?"),
         ([(V, 3)], "And this clip?")],
        [([(V, 1)], "Again?"), ([(V, 2)], "And now?"), ([(I, 1)], "Which one is this?"),
         ([], "Thanks!")],
        [([(V, 5)], "A new clip."), ([(V, 5)], "The same new clip, at once."),
         ([(I, 2), (V, 1)], "Both old ones."), ([(I, 3), (V, 3)], "Old and new."),
         ([(V, 4), (V, 4)], "Twice the same clip?")],
    ],
    "qwen2_audio": [
        [([(A, 1)], "What do you hear?"), ([(A, 2)], "And in this clip?"),
         ([(A, 3), (A, 4)], "Compare them."), ([], "Hello, how are you?")],
        [([(A, 1)], "Again?"), ([(A, 2)], "And now?"), ([], "Thanks!")],
        [([(A, 6)], "A new one."), ([(A, 6)], "The same new one, at once."),
         ([(A, 3), (A, 7)], "Old and new."), ([(A, 5), (A, 5)], "Twice the same?")],
    ],
}
METRICS_PAGE = "metrics.txt"  # the engine's /metrics page, as a server would serve it


def progress(text: str) -> None:
    print(f"PROGRESS {text}", flush=True)


def items_by_modality(arch: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for batch in ROUNDS[arch]:
        for items, _ in batch:
            for modality, _seed in items:
                counts[modality] = counts.get(modality, 0) + 1
    return counts


class StepTokens(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.steps, self.prefill, self.decode = 0, 0, 0

    def emit(self, record):
        if not str(record.msg).startswith("step_tokens "):
            return  # another line of mmscope's logger
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


def ttft_parts(metrics) -> dict[str, dict[str, float]]:
    """outcome -> {"requests": n, part: mean ms}, from vllm:request_ttft_part_seconds."""
    from mmscope.expose.ttft_histograms import PART_HISTOGRAM

    sums: dict[tuple[str, str], list[float]] = {}
    for m in metrics:
        if m.name == PART_HISTOGRAM[0]:
            labels = dict(m.labels)
            total = sums.setdefault((labels["encoder_cache"], labels["part"]), [0.0, 0])
            total[0] += m.sum
            total[1] += m.count
    out: dict[str, dict[str, float]] = {}
    for (outcome, part), (seconds, count) in sorted(sums.items()):
        if count:
            out.setdefault(outcome, {"requests": count})[part] = 1000 * seconds / count
    return out


def write_metrics_page(path: str) -> None:
    """vLLM's series in this process (what LLM.get_metrics() reads), as /metrics serves them."""
    from prometheus_client import REGISTRY, generate_latest

    with open(path, "wb") as f:
        f.write(generate_latest(REGISTRY))


def main(out_dir: str, model: str, arch: str = "llava") -> int:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from mmscope.demo.tiny_model import family

    fam = family(arch)
    progress("starting vLLM CPU with the mmscope plugin")
    from vllm import LLM, SamplingParams

    from mmscope.expose import readout

    t0 = time.monotonic()
    llm = LLM(model=model, enforce_eager=True, max_model_len=512, max_num_seqs=8,
              max_num_batched_tokens=256, limit_mm_per_prompt={m: 2 for m in fam.MODALITIES},
              kv_cache_memory_bytes=64 * 2**20, seed=0, disable_log_stats=False)
    progress(f"engine ready in {time.monotonic() - t0:.1f} s")
    steps, stats = StepTokens(), StatsLine()
    step_logger = logging.getLogger("vllm.mmscope")  # step_tokens lines: DEBUG every step
    step_logger.setLevel(logging.DEBUG)
    step_logger.addHandler(steps)
    logging.getLogger("vllm.v1.metrics.loggers").addHandler(stats)
    sp = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    rounds = ROUNDS[arch]
    for n, batch in enumerate(rounds, 1):
        llm.generate([fam.prompt(items, text) for items, text in batch], sp, use_tqdm=False)
        progress(f"batch {n}/{len(rounds)}: {len(batch)} requests, "
                 f"{sum(len(i) for i, _ in batch)} items")
    llm.llm_engine.do_log_stats()
    summary = {
        "arch": arch,
        "counters": {k: v for k, v in readout.from_vllm_metrics(llm.get_metrics()).items()
                     if k.startswith(("encoder_cache", "mm_cache", "prefix_cache"))},
        "steps": {"steps": steps.steps, "prefill_tokens": steps.prefill,
                  "decode_tokens": steps.decode},
        "stats_line": stats.lines[-1] if stats.lines else None,
        "requests": sum(len(b) for b in rounds),
        "ttft_parts": ttft_parts(llm.get_metrics()),
        "items": items_by_modality(arch),
    }
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    write_metrics_page(os.path.join(out_dir, METRICS_PAGE))
    progress("workload done")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
