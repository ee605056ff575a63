"""`mmscope demo` as a new user runs it: exit 0, every section, exact counters, files written; the
default family (LLaVA) on a new machine, and Qwen2.5-VL with videos (`--arch`)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from mmscope.demo import environment

pytestmark = pytest.mark.vllm
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_demo(out, *args, env=None):
    proc = subprocess.run([sys.executable, "-m", "mmscope.cli", "demo", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout, json.loads((out / "summary.json").read_text())


def new_machine(tmp_path) -> dict[str, str]:
    """vLLM's cache empty (so vLLM inspects the model in a subprocess) and none of the tests'
    own set-up on PYTHONPATH: what the demo needs, it must bring itself."""
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and p != environment.STARTUP_DIR]
    return dict(os.environ, VLLM_CACHE_ROOT=str(tmp_path / "vllm-cache"),
                PYTHONPATH=os.pathsep.join(path))


def test_demo_end_to_end(tmp_path):
    out = tmp_path / "demo"
    text, summary = run_demo(out, env=new_machine(tmp_path))
    for needle in ("gpu_model_runner: vit_forward", "mm:processor:hf_processor", "mm:hash:pil_image",
                   "every step_meta joins", "encoder cache hit rate: 50.0% over 18 images in "
                   "17 requests", "Encoder cache hit rate: 50.0%", "step_tokens:", "report.html"):
        assert needle in text, needle
    c = summary["counters"]
    # The scripted workload: 18 image items, 9 distinct contents computed once each.
    assert (c["encoder_cache_queries"], c["encoder_cache_hits"], c["encoder_cache_misses"]) == (18, 9, 9)
    assert c["encoder_cache_hits_by_source{source=in_step}"] == 2
    # Each item once by its way: the processor cache held the 9 repeats too (the second copy of
    # an image in one request as well: vLLM counts it a hit), and both layers saved time.
    ways = summary["layers"]
    assert ways["encoder"] == {"cache_hit": 9, "prefix_covered": 0, "ec_loaded": 0, "computed": 9}
    assert ways["processor"] == {"hit": 9, "miss": 9, "off": 0}
    assert (ways["processor"]["hit"], ways["processor"]["hit"] + ways["processor"]["miss"]) == (
        c["mm_cache_hits"], c["mm_cache_queries"])
    assert ways["saved_s"]["processor_cache"] > 0 and ways["saved_s"]["encoder_cache"] > 0
    assert "where items were served from" in text
    # the next step the demo prints: analyze with its /metrics page says the layers too
    done = subprocess.run([sys.executable, "-m", "mmscope.cli", "analyze",
                           str(out / "profile.sqlite"), "--metrics", str(out / "metrics.txt")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert ("items served from: encoder cache 9, encoder 9 (18 items; processor cache hit 9, "
            "miss 9)") in done.stdout
    assert re.search(r"work saved: [\d.]+ s \(processor cache [\d.]+ s, encoder cache [\d.]+ s\)",
                     done.stdout)
    # 14 of the 17 requests carry images: each has its first token split, hits and misses apart
    split = summary["ttft_parts"]
    assert split["hit"]["requests"] + split["miss"]["requests"] == 14
    assert split["hit"]["encoder"] == 0 < split["miss"]["encoder"]
    assert "time to first token by part" in text
    assert summary["steps"]["steps"] > 0 and summary["steps"]["prefill_tokens"] > 0
    for f in ("report.html", "access.log", "vllm.log"):
        assert (out / f).stat().st_size > 0
    assert os.listdir(out / "traces")
    # The package build compiles the NVTX recorder on Linux, so the demo records real NVTX.
    assert (out / "profile.sqlite").stat().st_size > 0
    # `make screenshot`'s script draws the README's picture of this report in Chromium.
    png = tmp_path / "report.png"
    drawn = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "report_screenshot.py"),
                            "--demo", str(out), "--out", str(png)], capture_output=True, text=True,
                           timeout=300)
    assert drawn.returncode == 0, drawn.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 50_000


def test_demo_with_videos(tmp_path):
    out = tmp_path / "demo"
    text, summary = run_demo(out, "--arch", "qwen2_5_vl")
    for needle in ("gpu_model_runner: vit_forward", "queries (video)", "encoder cache hit rate: "
                   "50.0% over 11 videos and 5 images in 14 requests", "report.html"):
        assert needle in text, needle
    c = summary["counters"]
    # 16 items, 8 distinct contents: 6 hits on entries of earlier requests, 2 within a step.
    assert (c["encoder_cache_queries"], c["encoder_cache_hits"], c["encoder_cache_misses"]) == (16, 8, 8)
    assert (c["encoder_cache_queries_by_modality{modality=video}"],
            c["encoder_cache_queries_by_modality{modality=image}"]) == (11, 5)
    assert (c["encoder_cache_hits_by_source{source=local}"],
            c["encoder_cache_hits_by_source{source=in_step}"]) == (6, 2)
