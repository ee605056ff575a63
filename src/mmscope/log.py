"""The one logger mmscope writes to, in every process and every module.

A child of vLLM's `vllm` logger, so that vLLM's own log configuration formats and filters our lines.
"""
from __future__ import annotations

import logging

logger = logging.getLogger("vllm.mmscope")
