"""`mmscope demo` and `mmscope tiny-model` refuse bad arguments with one line, before any engine."""
from __future__ import annotations

import subprocess
import sys

import pytest


def mmscope(*args):
    return subprocess.run([sys.executable, "-m", "mmscope.cli", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("where", ["file/inside", "/proc/mmscope-demo"])
def test_demo_out_that_cannot_be_made(tmp_path, where):
    (tmp_path / "file").write_text("")
    out = str(tmp_path / where) if where.startswith("file") else where
    proc = mmscope("demo", "--out", out)
    assert proc.returncode != 0
    assert proc.stderr.startswith(f"mmscope: error: --out {out}: cannot make the folder")
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_demo_out_that_is_a_file(tmp_path):
    (tmp_path / "file").write_text("")
    proc = mmscope("demo", "--out", str(tmp_path / "file"))
    assert proc.returncode != 0
    assert proc.stderr.strip() == f"mmscope: error: --out {tmp_path / 'file'} exists and is not a folder"


@pytest.mark.parametrize("command", ["demo", "tiny-model"])
def test_an_unknown_arch_is_refused(command):
    proc = mmscope(command, "--arch", "gpt2")
    assert proc.returncode == 2 and "invalid choice: 'gpt2'" in proc.stderr
