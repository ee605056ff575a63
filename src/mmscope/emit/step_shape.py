"""Per-step batch shape: the `step_tokens` log line and the zero-duration `step_meta` range.

Prefill means the request has not yet computed its whole prompt (num_computed < num_prompt).
"""
from __future__ import annotations

import logging

from mmscope import stages
from mmscope.emit import tracing

INFO_EVERY = 50
# The step_tokens message, % (step, prefill, decode, total, reqs).
STEP_TOKENS_FORMAT = "step_tokens step=%d prefill=%d decode=%d total=%d num_reqs=%d"


class StepTelemetry:
    def __init__(self, logger: logging.Logger, emit_log: bool = True):
        self.logger = logger
        self.emit_log = emit_log  # the log line comes from the first tensor-parallel rank only
        self.step = 0
        self._log = False

    def next_step(self) -> int | None:
        """Count one executed step (on the forward's thread, before it); the log level of its
        line, or None when neither a range nor a line needs the step's shape."""
        self.step += 1
        level = logging.INFO if self.step % INFO_EVERY == 0 else logging.DEBUG
        self._log = self.emit_log and self.logger.isEnabledFor(level)
        return level if self._log or tracing.on else None

    def emit(self, shape: stages.StepShape, level: int) -> None:
        tracing.mark(stages.step_meta_range(shape))
        if self._log:
            self.logger.log(level, STEP_TOKENS_FORMAT, self.step, shape.prefill, shape.decode,
                            shape.total, shape.reqs)


def split_prefill_decode(num_scheduled, num_computed, num_prompt) -> stages.StepShape:
    """Tokens of the step by kind; sequences are per request, in the batch's order. Batches are
    small, so plain Python beats numpy's per-call overhead here."""
    scheduled = num_scheduled.tolist() if hasattr(num_scheduled, "tolist") else list(num_scheduled)
    computed = num_computed.tolist() if hasattr(num_computed, "tolist") else list(num_computed)
    prompt = num_prompt.tolist() if hasattr(num_prompt, "tolist") else list(num_prompt)
    prefill = sum(s for s, c, p in zip(scheduled, computed, prompt) if c < p)
    total = sum(scheduled)
    return stages.StepShape(prefill, total - prefill, total, len(scheduled))
