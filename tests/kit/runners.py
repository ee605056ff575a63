"""The model runner the engine tests use: V1 (vLLM CPU's default), or with MMSCOPE_TEST_RUNNER=v2
Model Runner V2, run on CPU through Triton's interpreter (the test-only start-up of
tests/kit/startup/runner_v2; never in users' processes). `make test` runs the suite once on V1, then the
engine tests marked `runners` once more on V2."""
from __future__ import annotations

import os
import runpy

V1, V2 = "v1", "v2"
ENV = "MMSCOPE_TEST_RUNNER"
V2_STARTUP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup", "runner_v2")


def current() -> str:
    return os.environ.get(ENV, V1)


def environment(runner: str, pythonpath: str | None = None) -> dict[str, str]:
    """The variables that make a new vLLM process (and those it spawns) use `runner`."""
    if runner not in (V1, V2):
        raise ValueError(f"{ENV}={runner!r}: choose {V1} or {V2}")
    if runner == V1:
        return {}
    parts = [p for p in (pythonpath or "").split(os.pathsep) if p]
    return {"VLLM_USE_V2_MODEL_RUNNER": "1", "TRITON_INTERPRET": "1",
            "PYTHONPATH": os.pathsep.join(parts + [V2_STARTUP])}


def select() -> None:
    """Before vLLM is imported (tests/conftest.py): this process and every process it starts use
    the chosen runner. vLLM decides whether Triton works when it is first imported, so the
    stand-in backend is installed here as the start-up file installs it in new processes."""
    env = environment(current(), os.environ.get("PYTHONPATH"))
    if env:
        os.environ.update(env)
        runpy.run_path(os.path.join(V2_STARTUP, "sitecustomize.py"))


# For a process that must run V1 whatever the test run's runner: an EC producer (under V2, vLLM's
# encoder-only instance fails in vLLM itself, docs/design.md §7).
V1_ONLY = {"VLLM_USE_V2_MODEL_RUNNER": "0"}
