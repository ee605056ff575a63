"""`mmscope doctor` on vLLM 0.34 under each of its runners: the runner the platform picks, and
which rows apply to it (0.34's two V2 code bases have rows of their own)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mmscope.vllm import runners
from tests.kit import vllm034


@pytest.mark.parametrize("runner, expected", [(vllm034.V2, runners.V2),
                                              (vllm034.STANDALONE, runners.V2_STANDALONE)])
def test_doctor_names_the_runner_and_counts_its_rows(runner, expected):
    env = vllm034.process_environment(runner)
    done = subprocess.run([sys.executable, "-m", "mmscope.cli", "doctor", "--json"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout)
    assert data["runner"]["expected"] == expected
    here = [h for h in data["hooks"] if h["status"] != "not in this release"]
    assert all(h["status"] == "ok" for h in here)
    assert {h["runner"] for h in here if h["applies"]} == {None, expected}
    other = runners.V2 if expected == runners.V2_STANDALONE else runners.V2_STANDALONE
    assert {h["runner"] for h in here if not h["applies"]} == {other}
    text = subprocess.run([sys.executable, "-m", "mmscope.cli", "doctor"], env=env | {
        "COLUMNS": "200"}, capture_output=True, text=True, timeout=300).stdout
    mine = sum(h["applies"] for h in here)
    assert (f"{mine} of the {mine} hooks that apply to {runners.TITLE[expected]} ok; "
            f"{len(here) - mine} are the other runner's") in text
