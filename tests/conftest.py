"""vLLM's environment for every test: offline, no usage reports, the model runner of the test run
(tests/kit/runners.py).

The engine fixtures (the tiny model, a shared server) live in tests/engine/conftest.py.
"""
from __future__ import annotations

import os

# vLLM must never reach a model hub or phone home from tests.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")


from tests.kit import runners  # noqa: E402

runners.select()
