"""The step's shape from vLLM's persistent InputBatch: exact step_tokens lines and step_meta
marks, INFO every 50th step, only the first tensor-parallel rank logs, levels read per step."""
from __future__ import annotations

import functools
import logging
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmscope import stages
from mmscope.emit import step_shape, tracing
from mmscope.log import logger as mmscope_logger
from mmscope.vllm.worker import step_telemetry
from mmscope.vllm.patching import Hook
from tests.kit import traces as tk


class Recorder(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[tuple[int, str]] = []

    def emit(self, record):
        self.lines.append((record.levelno, record.getMessage()))


def a_logger(name: str, level: int) -> tuple[logging.Logger, Recorder]:
    logger = logging.getLogger(name)
    logger.handlers.clear()
    logger.propagate = False
    logger.setLevel(level)
    handler = Recorder()
    logger.addHandler(handler)
    return logger, handler


@functools.cache
def _input_batch_classes():
    import torch
    from vllm import SamplingParams
    from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

    return torch, SamplingParams, CachedRequestState, InputBatch


def runner(rows) -> SimpleNamespace:
    """A model runner holding vLLM's own InputBatch with one request per (computed, prompt)
    row, as the runner's persistent batch holds the step's requests."""
    torch, SamplingParams, CachedRequestState, InputBatch = _input_batch_classes()
    batch = InputBatch(max_num_reqs=max(8, len(rows)), max_model_len=4096,
                       max_num_batched_tokens=4096, device=torch.device("cpu"), vocab_size=100,
                       block_sizes=[16], max_num_blocks_per_req=[256])
    for i, (computed, prompt) in enumerate(rows):
        outputs = [1] * max(0, computed - prompt + 1) if computed >= prompt else []
        batch.add_request(CachedRequestState(f"r{i}", list(range(prompt)), [], SamplingParams(),
                                             None, ([],), computed, outputs))
    return SimpleNamespace(input_batch=batch)


def step(telemetry, batch_runner, scheduled):
    """What inputs_prepared does for one step."""
    level = telemetry.next_step()
    if level is not None:
        telemetry.emit(step_telemetry.batch_shape(batch_runner, scheduled), level)


@pytest.fixture(autouse=True)
def tracing_off():
    yield
    tracing.configure("off")


def test_exact_step_tokens_lines_for_given_arrays():
    logger, lines = a_logger("mmscope.test.steps.exact", logging.DEBUG)
    telemetry = step_shape.StepTelemetry(logger)
    # r0 prefills 5 of 5, r1 decodes, r2 prefills a chunk of 3 (2 of 9 computed)
    batch_runner = runner([(0, 5), (7, 7), (2, 9)])
    step(telemetry, batch_runner, np.array([5, 1, 3], np.int32))
    # the persistent batch's rows past num_reqs are not the step's
    step(telemetry, batch_runner, np.array([2, 1, 4, 99], np.int32))
    assert lines.lines == [
        (logging.DEBUG, "step_tokens step=1 prefill=8 decode=1 total=9 num_reqs=3"),
        (logging.DEBUG, "step_tokens step=2 prefill=6 decode=1 total=7 num_reqs=3")]


def test_step_meta_marks_for_given_arrays(tmp_path):
    tracing.configure("chrome", str(tmp_path))
    logger, lines = a_logger("mmscope.test.steps.marks", logging.WARNING)
    telemetry = step_shape.StepTelemetry(logger)
    batch_runner = runner([(0, 5), (7, 7), (2, 9)])
    step(telemetry, batch_runner, np.array([5, 1, 3], np.int32))
    step(telemetry, runner([(12, 12)]), np.array([1], np.int32))
    tracing.flush()
    marks = [r for r in tk.load(tmp_path)[0] if r.name.startswith(stages.STEP_META_PREFIX)]
    assert [m.name for m in marks] == ["step_meta: prefill=8 decode=1 total=9 reqs=3",
                                       "step_meta: prefill=0 decode=1 total=1 reqs=1"]
    assert all(m.start == m.end for m in marks)  # zero-duration
    assert lines.lines == []  # WARNING: the marks need the shape, the log does not


def test_info_every_50th_step_debug_otherwise():
    logger, lines = a_logger("mmscope.test.steps.info", logging.INFO)
    telemetry = step_shape.StepTelemetry(logger)
    batch_runner = runner([(3, 3)])
    for _ in range(120):
        step(telemetry, batch_runner, np.array([1], np.int32))
    assert lines.lines == [
        (logging.INFO, f"step_tokens step={n} prefill=0 decode=1 total=1 num_reqs=1")
        for n in (50, 100)]
    assert step_shape.INFO_EVERY == 50


def test_only_the_first_rank_logs(tmp_path):
    logger, lines = a_logger("mmscope.test.steps.rank", logging.DEBUG)
    telemetry = step_shape.StepTelemetry(logger, emit_log=False)
    batch_runner = runner([(0, 4)])
    assert telemetry.next_step() is None  # tracing off: no rank needs the shape
    tracing.configure("chrome", str(tmp_path))
    step(telemetry, batch_runner, np.array([4], np.int32))
    tracing.flush()
    assert lines.lines == [] and telemetry.step == 2
    assert [r.name for r in tk.load(tmp_path)[0]] == [
        "step_meta: prefill=4 decode=0 total=4 reqs=1"]  # every rank marks its steps


def test_level_changes_take_effect_on_the_next_step():
    logger, lines = a_logger("mmscope.test.steps.levels", logging.WARNING)
    telemetry = step_shape.StepTelemetry(logger)
    batch_runner, scheduled = runner([(0, 4), (5, 5)]), np.array([4, 1], np.int32)
    step(telemetry, batch_runner, scheduled)  # step 1, DEBUG: not enabled
    assert lines.lines == []
    logger.setLevel(logging.DEBUG)
    step(telemetry, batch_runner, scheduled)  # step 2
    logger.setLevel(logging.INFO)
    for _ in range(48):  # steps 3..50: only the 50th is INFO
        step(telemetry, batch_runner, scheduled)
    logger.disabled = True
    for _ in range(50):  # step 100 is INFO, but the logger is disabled
        step(telemetry, batch_runner, scheduled)
    logger.disabled = False
    assert lines.lines == [
        (logging.DEBUG, "step_tokens step=2 prefill=4 decode=1 total=5 num_reqs=2"),
        (logging.INFO, "step_tokens step=50 prefill=4 decode=1 total=5 num_reqs=2")]
    assert telemetry.step == 100


rows = st.lists(st.tuples(st.integers(1, 64), st.integers(0, 512), st.integers(1, 512)),
                min_size=1, max_size=8)


@settings(max_examples=25, deadline=None)
@given(steps=st.lists(rows, min_size=1, max_size=4))
def test_lines_equal_a_plain_count_of_the_batch(steps):
    logger, lines = a_logger("mmscope.test.steps.property", logging.DEBUG)
    telemetry = step_shape.StepTelemetry(logger)
    expected = []
    for n, batch_rows in enumerate(steps, 1):
        scheduled = [s for s, _, _ in batch_rows]
        step(telemetry, runner([(c, p) for _, c, p in batch_rows]), np.array(scheduled, np.int32))
        prefill = sum(s for s, c, p in batch_rows if c < p)
        expected.append((logging.DEBUG, f"step_tokens step={n} prefill={prefill} "
                         f"decode={sum(scheduled) - prefill} total={sum(scheduled)} "
                         f"num_reqs={len(batch_rows)}"))
    assert lines.lines == expected


class ModelRunner:  # GPUModelRunner._prepare_inputs' signature
    def __init__(self, rows):
        self.input_batch = runner(rows).input_batch

    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
        return ("prepared", scheduler_output)


def test_the_step_shape_hook_logs_on_mmscopes_logger_and_keeps_the_result(caplog):
    hook = Hook("test.step_shape", f"{__name__}:ModelRunner._prepare_inputs",
                ("num_scheduled_tokens",), step_telemetry.inputs_prepared,
                "telemetry", "worker")
    model_runner = ModelRunner([(0, 6), (9, 9)])
    hook.apply()
    try:
        first = step_telemetry._telemetry().step + 1  # one counter per process
        with caplog.at_level(logging.DEBUG, logger=mmscope_logger.name):
            assert model_runner._prepare_inputs("out", np.array([6, 1], np.int32)) == (
                "prepared", "out")
            assert model_runner._prepare_inputs("out", np.array([1, 1], np.int32)) == (
                "prepared", "out")
    finally:
        hook.revert()
    ours = [(r.name, r.getMessage()) for r in caplog.records if "step_tokens" in r.getMessage()]
    assert ours == [
        ("vllm.mmscope", f"step_tokens step={first} prefill=6 decode=1 total=7 num_reqs=2"),
        ("vllm.mmscope", f"step_tokens step={first + 1} prefill=1 decode=1 total=2 num_reqs=2")]
