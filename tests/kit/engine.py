"""Test helpers around the real vLLM engine: images, prompts, counters, encoder work counted
on the worker side (in-process engines run the worker in the test process)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from mmscope.demo.inputs import image  # noqa: F401 - distinct content per seed, for the tests
from mmscope.expose import readout


def prompt(images, text="What is this?"):
    data = images if len(images) != 1 else images[0]
    return {"prompt": "<s>user: " + "<image>" * len(images) + text + "\nassistant:",
            "multi_modal_data": {"image": data} if images else None} if images else \
        {"prompt": f"<s>user: {text}\nassistant:"}


def offline_llm(model: str, **overrides):
    """An in-process engine (the worker runs in this process, so tests can count its work)."""
    from vllm import LLM

    kwargs = dict(model=model, enforce_eager=True, max_model_len=512, max_num_seqs=4,
                  max_num_batched_tokens=256, limit_mm_per_prompt={"image": 3},
                  kv_cache_memory_bytes=64 * 2**20, seed=0, disable_log_stats=False)
    kwargs.update(overrides)
    # Only for this engine's construction: servers started later by other tests inherit
    # os.environ and must stay multiprocess.
    before = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        return LLM(**kwargs)
    finally:
        if before is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = before


def counters(llm) -> dict[str, float]:
    return readout.from_vllm_metrics(llm.get_metrics())


class EncoderWork:
    """Counts what the vision (or audio) encoder really computes: wraps the model class's
    embed_multimodal, which the worker calls once per encoder batch; `items` outputs, `rows`
    their embeddings, `nbytes` their bytes as the worker holds them. Made before the engine:
    a V2 runner wraps the loaded model's method on the instance."""

    def __init__(self, model_class: str = "vllm.model_executor.models.llava:"
                                          "LlavaForConditionalGeneration"):
        import importlib

        module, _, name = model_class.partition(":")
        cls = getattr(importlib.import_module(module), name)
        self.cls, self.items, self.rows, self.nbytes = cls, 0, 0, 0
        self._orig = cls.embed_multimodal
        work = self

        def counted(model_self, **kwargs):
            out = work._orig(model_self, **kwargs)
            work.items += len(out)
            work.rows += sum(t.shape[0] for t in out)
            work.nbytes += sum(t.nbytes for t in out)
            return out

        cls.embed_multimodal = counted

    def reset(self) -> None:
        """The engine's start ran the encoder on dummy inputs: count from here."""
        self.items = self.rows = self.nbytes = 0

    def close(self):
        self.cls.embed_multimodal = self._orig


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def results_run(model: str, *args: str, env: dict | None = None) -> dict:
    """tests/kit/results_run.py's fixed workload in a fresh process: what it printed."""
    proc = subprocess.run([sys.executable, "-m", "tests.kit.results_run", model, *args],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=dict(os.environ, **(env or {})))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])
