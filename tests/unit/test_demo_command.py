"""`mmscope demo` and `mmscope tiny-model` refuse bad arguments with one line, before any engine;
`mmscope tiny-model` says, and exports, what its server needs."""
from __future__ import annotations

import os
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


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A tiny model `mmscope tiny-model` built, and its plain output."""
    path = tmp_path_factory.mktemp("tiny") / "tiny-llava"
    proc = mmscope("tiny-model", str(path))
    assert proc.returncode == 0, proc.stderr
    return path, proc.stdout


def test_tiny_model_prints_the_whole_environment_its_server_needs(built):
    from mmscope.demo import environment

    path, out = built
    serve = next(line for line in out.splitlines() if line.startswith("serve it: "))
    assert f"PYTHONPATH={environment.STARTUP_DIR}" in serve and "VLLM_CPU_KVCACHE_SPACE=1" in serve
    assert serve.endswith(f"python -m vllm.entrypoints.openai.api_server --model {path} "
                          "--max-model-len 1024 --enforce-eager")
    assert f'eval "$(mmscope tiny-model {path} --env)"' in out


def test_tiny_model_env_is_what_a_shell_evaluates(built):
    from mmscope.demo import environment

    path, _ = built
    script = (f'eval "$({sys.executable} -m mmscope.cli tiny-model {path} --env)"\n'
              'echo "$VLLM_CPU_KVCACHE_SPACE"; echo "$PYTHONPATH"\n')
    before = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] + ["/elsewhere"]
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(before)})
    assert done.returncode == 0, done.stderr
    rest = [p for p in before if p != environment.STARTUP_DIR]  # the engine tests' set-up has it
    assert done.stdout.splitlines() == ["1", os.pathsep.join([environment.STARTUP_DIR, *rest])]
