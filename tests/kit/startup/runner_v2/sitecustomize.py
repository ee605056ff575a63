"""Test-only start-up: lets vLLM CPU run Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1), whose kernels
are Triton's, through Triton's interpreter (TRITON_INTERPRET=1). The installed Triton has no CPU
backend, so vLLM would refuse V2; a stand-in "cpu" backend whose driver is always active makes it
accept, and the interpreter then runs the kernels on CPU tensors. Never in users' processes: the
engine tests put this folder on PYTHONPATH (tests/kit/runners.py)."""
import os

if os.environ.get("TRITON_INTERPRET") == "1":
    import triton.backends as _backends

    class _InterpreterOnlyDriver:
        @staticmethod
        def is_active():
            return True

    _backends.backends.setdefault("cpu", _backends.Backend(compiler=None, driver=_InterpreterOnlyDriver))
