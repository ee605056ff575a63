"""vLLM's own torch profiler holds mmscope's stage tree (MMSCOPE_TRACE=torch), and `mmscope analyze`
reads that trace: `mm:*` and `vit_forward` present, their counts exact, the cache benefit computed;
on it and on a stock vLLM run's trace (vLLM's own scopes, no mmscope) every check passes."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from mmscope import stages

pytestmark = pytest.mark.vllm

HERE = os.path.dirname(os.path.abspath(__file__))
# Three batches of two requests: four distinct images in the first two (one encoder batch each),
# then two of them again (all hits: no encoder batch). The hasher sees six items.
SCRIPT = r"""
import os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
if sys.argv[4] == "stock":  # vLLM's own record_function scopes, mmscope applying no hook
    os.environ["MMSCOPE_DISABLE"] = "1"
    os.environ["VLLM_CUSTOM_SCOPES_FOR_PROFILING"] = "1"
else:
    os.environ["MMSCOPE_TRACE"] = "torch"
sys.path.insert(0, sys.argv[3])
from vllm import SamplingParams
from tests.kit.engine import image, offline_llm, prompt
llm = offline_llm(sys.argv[1], profiler_config={"profiler": "torch",
                                                 "torch_profiler_dir": sys.argv[2]})
params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
llm.generate([prompt([image(1)])], params, use_tqdm=False)  # warm-up, not profiled
llm.start_profile()
for seeds in ([11, 12], [13, 14], [11, 13]):
    llm.generate([prompt([image(s)]) for s in seeds], params, use_tqdm=False)
llm.stop_profile()
"""


def profile(tiny_model, tmp_path_factory, kind: str):
    out = tmp_path_factory.mktemp(f"torch-profile-{kind}")
    root = os.path.dirname(os.path.dirname(HERE))
    done = subprocess.run([sys.executable, "-c", SCRIPT, tiny_model, str(out), root, kind],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    traces = glob.glob(os.path.join(out, "**", "*.json*"), recursive=True)
    assert traces, f"vLLM's torch profiler wrote no trace into {out}"
    return out, traces


@pytest.fixture(scope="module")
def profiled(tiny_model, tmp_path_factory):
    return profile(tiny_model, tmp_path_factory, "mmscope")


@pytest.fixture(scope="module")
def stock(tiny_model, tmp_path_factory):
    return profile(tiny_model, tmp_path_factory, "stock")


def analyze(path) -> dict:
    done = subprocess.run([sys.executable, "-m", "mmscope.cli", "analyze", str(path), "--json",
                           "--no-cache"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_torch_trace_holds_the_stage_tree_with_exact_counts(profiled):
    _, traces = profiled
    doc = analyze(max(traces, key=os.path.getsize))  # the worker's trace (in-process: the one)
    by_name = {s["name"]: s for s in doc["stages"]}
    assert by_name[stages.VIT_FORWARD]["count"] == 2, by_name.get(stages.VIT_FORWARD)
    assert by_name["mm:hash:pil_image"]["count"] == 6
    for stage in ("hf_processor", "prompt_update", "get_mm_hashes"):
        assert by_name[stages.PROCESSOR_PREFIX + stage]["count"] == 6
    # vLLM's own scopes beside ours, and nesting by containment: no share above 100%
    assert by_name[stages.FORWARD]["count"] >= 3
    assert all(s["share_of_parent"] is None or s["share_of_parent"] <= 1.0 for s in doc["stages"])
    # torch records vLLM's Python frames too: vit_forward's own parent is the encoder's frame,
    # and preprocess contains every stage of its tree
    inside = next(c for c in doc["checks"] if c["name"].startswith("preprocess children lie"))
    assert inside["ok"] and inside["detail"].startswith("all "), inside


def test_the_cache_benefit_is_computed_from_the_encoder_ranges(profiled):
    _, traces = profiled
    benefit = analyze(max(traces, key=os.path.getsize))["cache_benefit"]
    assert benefit, "no cache benefit computed"
    text = json.dumps(benefit)
    assert "no encoder ranges" not in text


@pytest.mark.parametrize("which", ["profiled", "stock"])
def test_every_check_passes_on_the_profilers_traces(which, request):
    """A torch trace read by its rules: its record_function annotations are the ranges (the
    Python frames that open and close them are not read), and they nest."""
    _, traces = request.getfixturevalue(which)
    doc = analyze(max(traces, key=os.path.getsize))
    assert all(c["ok"] for c in doc["checks"]), doc["checks"]
    nest = next(c for c in doc["checks"] if c["name"].startswith("ranges nest"))
    assert nest["detail"].startswith("all ") and " pass" in nest["detail"], nest
    names = {n["name"] for n in doc["tree"]}
    assert stages.FORWARD in names and stages.PREPROCESS in names
    assert not any("torch/autograd/profiler.py" in n for n in names)  # frames are no stages
