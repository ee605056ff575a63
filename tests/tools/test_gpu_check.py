"""scripts/gpu_check.py where no GPU is: one line and exit 2, importing only torch and the
standard library on the GPU side; its --analyze half on a real GPU trace (tests/data/torch) and on
a spool `mmscope record` kept, and on a CPU trace whose ranges have no device time."""
from __future__ import annotations

import glob
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.py"
TORCH = ROOT / "tests" / "data" / "torch"
PY = sys.executable

# What the GPU machine lacks: the analyzer's and the recorder's libraries, vLLM, the rest of
# mmscope's dependencies.
ABSENT = ("polars", "duckdb", "rich", "numpy", "pyarrow", "adbc_driver_sqlite",
          "adbc_driver_manager", "connectorx", "matplotlib", "nvtx", "vllm", "httpx",
          "prometheus_client", "wrapt", "hypothesis")
WITHOUT = f"""
import runpy, sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {ABSENT!r}:
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Absent())
sys.argv = [{str(SCRIPT)!r}, *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

RANGES = {"gpu_check: nvtx push": 3, "gpu_check: nvtx start/end": 1}
MARK = "gpu_check: nvtx mark"
NVTX_PROGRAM = f"""
import nvtx
for _ in range(3):
    nvtx.push_range("gpu_check: nvtx push")
    nvtx.pop_range()
r = nvtx.start_range("gpu_check: nvtx start/end")
nvtx.end_range(r)
nvtx.mark({MARK!r})
"""


def gpu_check(*args: str, without_gpu_libraries=False) -> subprocess.CompletedProcess:
    command = [PY, "-c", WITHOUT, *args] if without_gpu_libraries else [PY, str(SCRIPT), *args]
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


def test_without_cuda_it_says_so_in_one_line_and_exits_2_with_only_torch_imported(tmp_path):
    out = tmp_path / "run"
    done = gpu_check("--out", str(out), without_gpu_libraries=True)
    assert done.returncode == 2, done.stderr
    # torch itself warns that it found no numpy; the script says one line
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == \
        "gpu_check: no CUDA device here; run it on a machine with one"
    assert not out.exists()


def test_analyze_without_a_gpu_run_is_one_line_and_exit_2(tmp_path):
    done = gpu_check("--analyze", str(tmp_path))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "gpu_check.json" in done.stderr and "Traceback" not in done.stderr


def kept_spool(run: Path) -> str:
    """A spool of NVTX ranges as `mmscope record` leaves it with --keep-spool."""
    run.mkdir(exist_ok=True)
    done = subprocess.run([PY, "-m", "mmscope.cli", "record", "--keep-spool", "--spool-dir",
                           str(run), "-o", str(run / "recorded.sqlite"), "--",
                           PY, "-c", NVTX_PROGRAM], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (spool,) = glob.glob(str(run / ".mmscope-spool-*"))
    return Path(spool).name


def gpu_run(run: Path, trace: str, stages: list[str], spool: str | None) -> None:
    """The parts of a GPU run's gpu_check.json that --analyze reads."""
    (run / "gpu_check.json").write_text(json.dumps({
        "profiler": {"trace": trace, "stages": stages},
        "record": {"spool": spool or "nvtx-spool", "ranges": RANGES, "mark": MARK}}))


def test_analyze_passes_a_real_gpu_trace_and_a_kept_spool(tmp_path):
    """A torch trace from an A100 (its ranges' device times are their gpu_user_annotation's)
    and a spool of the same NVTX calls the GPU run makes."""
    spool = kept_spool(tmp_path)
    shutil.copy(TORCH / "hta-ddp-a100-nccl.json.gz", tmp_path)
    gpu_run(tmp_path, "hta-ddp-a100-nccl.json.gz", ["nccl:all_reduce", "nccl:broadcast"], spool)
    done = gpu_check("--analyze", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["PASS analyze_profiler_ranges",
                                                  "PASS analyze_record_nvtx"]
    assert "2 of 2 ranges report exactly" in lines[0]
    analyzed = json.loads((tmp_path / "analyze.json").read_text())
    (profile, record) = analyzed["checks"]
    assert profile["figures"]["nccl:all_reduce"] == {
        "trace_ns": 46784659, "analyze_ns": 46784659, "count": 15}
    assert record["figures"]["events"] == {**RANGES, MARK: 1}


def test_analyze_fails_ranges_without_device_time_and_a_missing_spool(tmp_path):
    """mmscope's ranges in a CPU profile have no gpu_user_annotation: no device time to report."""
    program = f"""
import torch
from torch.profiler import profile, ProfilerActivity
from mmscope import stages
from mmscope.emit import tracing
from mmscope.emit.stage_timer import StageCollector, timed_stage
tracing.configure("torch")
with profile(activities=[ProfilerActivity.CPU]) as prof:
    with timed_stage(stages.VIT_FORWARD, StageCollector()):
        torch.ones(64, 64) @ torch.ones(64, 64)
prof.export_chrome_trace({str(tmp_path / "cpu-trace.json")!r})
"""
    subprocess.run([PY, "-c", program], check=True, timeout=120,
                   env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    gpu_run(tmp_path, "cpu-trace.json", ["gpu_model_runner: vit_forward"], None)
    done = gpu_check("--analyze", str(tmp_path))
    assert done.returncode == 1
    assert [ln.split(":")[0] for ln in done.stdout.splitlines()] == [
        "FAIL analyze_profiler_ranges", "FAIL analyze_record_nvtx"]
    assert "no spool" in done.stdout.splitlines()[1]
    figures = json.loads((tmp_path / "analyze.json").read_text())["checks"][0]["figures"]
    assert figures["gpu_model_runner: vit_forward"]["trace_ns"] is None


@pytest.mark.parametrize("name", ["tracelens-bert-small-h100.json.gz"])
def test_the_trace_reading_is_the_analyzers(name, tmp_path):
    """The device time the script reads from a trace is what the analyzer reports for it."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(SCRIPT.parent))
    from mmscope.analyze import load
    from mmscope.analyze.report.analysis import analyze

    path = str(TORCH / name)
    expected = gpu_check.annotation_device_ns(gpu_check.load_events(path))
    stages = {s["name"]: s["device_ns"]  # one stage per annotation name
              for s in analyze(path, load(path), raw_names=True).stages}
    assert expected and all(stages[n] == ns for n, ns in expected.items())
