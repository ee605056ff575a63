"""The peer reads our recordings: nsys-ai 0.3.0, from its own environment, opens a real recording
and its per-name NVTX totals equal those of `mmscope analyze`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent.parent / "kit" / "nvtx_programs"
PY = sys.executable
NSYS_AI = "nsys-ai==0.3.0"
VENV = Path(os.environ.get("MMSCOPE_NSYS_AI_VENV",
                           Path.home() / ".cache" / "mmscope" / "nsys-ai-venv"))

# Profile.aggregate_nvtx_ranges is what nsys-ai's diff reports as NVTX totals: closed ranges of
# positive length, grouped by name.
TOTALS = """
import json, sys
from nsys_ai.profile import open as open_profile
with open_profile(sys.argv[1]) as profile:
    print(json.dumps(profile.aggregate_nvtx_ranges()))
"""


def _venv_python() -> Path:
    python = VENV / "bin" / "python"
    check = [str(python), "-c", "import importlib.metadata as m; print(m.version('nsys-ai'))"]
    if python.exists() and subprocess.run(check, capture_output=True, text=True).stdout.strip() == "0.3.0":
        return python
    subprocess.run([PY, "-m", "venv", "--clear", str(VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", NSYS_AI], check=True, timeout=900)
    return python


@pytest.fixture(scope="module")
def nsys_ai_python() -> Path:
    return _venv_python()


def test_nsys_ai_totals_equal_ours(tmp_path, nsys_ai_python):
    db, facts = tmp_path / "run.sqlite", tmp_path / "facts.json"
    res = subprocess.run([PY, "-m", "mmscope.cli", "record", "-o", str(db), "--", PY,
                          str(DATA / "nvtx_program.py"), str(facts)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr

    peer = subprocess.run([str(nsys_ai_python), "-c", TOTALS, str(db)], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert peer.returncode == 0, peer.stderr[-3000:]
    theirs = {r["text"]: (r["count"], r["total_ns"]) for r in json.loads(peer.stdout)}

    ours_run = subprocess.run([PY, "-m", "mmscope.cli", "analyze", str(db), "--json"],
                              capture_output=True, text=True, timeout=120)
    assert ours_run.returncode == 0, ours_run.stderr
    stages = json.loads(ours_run.stdout)["stages"]
    ours = {s["name"]: (s["count"], s["total_ns"]) for s in stages if s["total_ns"] > 0}

    assert len(ours) == 7 and theirs == ours
    # what nsys-ai leaves out is exactly what has no length: the mark and the range never closed
    assert {s["name"] for s in stages} - set(theirs) == {"tick", "never-closed"}
