"""The C step observer against its Python reference (telemetry.StepTelemetry via step_shape_seen):
same counter, same levels, same step_tokens text, same step_meta events, on vLLM's array types."""
from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmscope import stages
from mmscope.emit import step_shape as telemetry, tracing
from mmscope.emit.chrome import ChromeTraceWriter
from mmscope.vllm import ranges


@pytest.fixture(scope="module")
def native():
    if ranges._native_steps is None:
        if sys.platform.startswith("linux"):
            pytest.fail("the C step observer was not built (setup.py build_ext)")
        pytest.skip("the C step observer is optional off Linux")
    return ranges._native_steps


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


def observers(native, name: str, level: int, first_rank: bool = True, info_every: int = 3):
    """(C observer, Python observer), each with its own logger at `level`."""
    c_logger, c_lines = a_logger(name + ".c", level)
    py_logger, py_lines = a_logger(name + ".py", level)
    c = native.StepObserver(c_logger, lambda: first_rank, tracing, info_every,
                            stages.STEP_META_FORMAT, telemetry.STEP_TOKENS_FORMAT,
                            ranges.batch_shape)
    py = telemetry.StepTelemetry(py_logger, emit_log=first_rank)
    py_observe = python_observer(py, info_every)
    return (c, c_lines), (py_observe, py_lines)


def python_observer(step_telemetry, info_every):
    def observe(runner, scheduler_output, num_scheduled_tokens):
        saved, telemetry.INFO_EVERY = telemetry.INFO_EVERY, info_every
        try:
            level = step_telemetry.next_step()
        finally:
            telemetry.INFO_EVERY = saved
        if level is not None:
            step_telemetry.emit(ranges.batch_shape(runner, num_scheduled_tokens), level)
    return observe


def runner(computed, prompt, num_reqs, dtype=np.int32):
    """The attributes the observer reads, as vLLM's InputBatch holds them (numpy views of its
    persistent CPU tensors, longer than the step's num_reqs rows)."""
    pad = [0] * 3
    return SimpleNamespace(input_batch=SimpleNamespace(
        num_reqs=num_reqs, num_computed_tokens_cpu=np.array(list(computed) + pad, dtype),
        num_prompt_tokens=np.array(list(prompt) + pad, dtype)))


rows = st.lists(st.tuples(st.integers(1, 512), st.integers(0, 2048), st.integers(1, 2048)),
                min_size=1, max_size=32)


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(rows, min_size=1, max_size=8), dtype=st.sampled_from([np.int32, np.int64]))
def test_same_lines_as_the_python_observer(native, steps, dtype):
    (c, c_lines), (py, py_lines) = observers(native, "mmscope.test.steps.same", logging.DEBUG)
    for step in steps:
        sched, computed, prompt = (np.array([r[i] for r in step], dtype) for i in range(3))
        batch = runner(computed, prompt, len(step), dtype)
        c(batch, None, sched)
        py(batch, None, sched)
    assert c.step == len(steps)
    assert c_lines.lines == py_lines.lines and len(c_lines.lines) == len(steps)
    assert [level for level, _ in c_lines.lines] == [
        logging.INFO if k % 3 == 0 else logging.DEBUG for k in range(1, len(steps) + 1)]


def test_level_changes_take_effect_on_the_next_step(native):
    (c, lines), _ = observers(native, "mmscope.test.steps.levels", logging.WARNING)
    batch, sched = runner([0, 5], [4, 5], 2), np.array([4, 1], np.int32)
    c(batch, None, sched)  # step 1, DEBUG: not enabled
    assert lines.lines == []
    c.logger.setLevel(logging.DEBUG)
    c(batch, None, sched)
    c.logger.setLevel(logging.INFO)
    c(batch, None, sched)  # step 3 is INFO (every 3rd)
    c(batch, None, sched)  # step 4, DEBUG: filtered again
    assert lines.lines == [
        (logging.DEBUG, "step_tokens step=2 prefill=4 decode=1 total=5 num_reqs=2"),
        (logging.INFO, "step_tokens step=3 prefill=4 decode=1 total=5 num_reqs=2")]
    c.logger.disabled = True
    c(batch, None, sched)
    c(batch, None, sched)  # step 6 is INFO, but the logger is disabled
    c.logger.disabled = False
    assert len(lines.lines) == 2 and c.step == 6


def test_only_the_first_rank_logs(native):
    (c, lines), _ = observers(native, "mmscope.test.steps.rank", logging.DEBUG, first_rank=False)
    c(runner([0], [4], 1), None, np.array([4], np.int32))
    assert lines.lines == [] and c.emit_log == 0 and c.step == 1


def test_unusual_arrays_give_the_same_answer(native):
    """A list or a big-endian array takes the Python road; a strided view stays in C."""
    (c, c_lines), (py, py_lines) = observers(native, "mmscope.test.steps.odd", logging.DEBUG)
    for sched, batch in (([4, 2], runner([0, 3], [4, 9], 2)),
                         (np.array([4, 2], ">i4"), runner([0, 3], [4, 9], 2)),
                         (np.array([4, 7, 2, 9], np.int32)[::2], runner([0, 3], [4, 9], 2))):
        c(batch, None, sched)
        py(batch, None, sched)
    assert c_lines.lines == py_lines.lines
    assert [m.split(" ", 2)[2] for _, m in c_lines.lines] == [
        "prefill=6 decode=0 total=6 num_reqs=2"] * 3


def test_step_meta_events_match(native, tmp_path):
    tracing.configure("chrome", str(tmp_path))
    try:
        (c, _), (py, _) = observers(native, "mmscope.test.steps.marks", logging.WARNING)
        writer = ChromeTraceWriter.for_process(str(tmp_path))
        batch, sched = runner([0, 7, 2], [5, 7, 9], 3), np.array([5, 1, 3], np.int32)
        c(batch, None, sched)
        py(batch, None, sched)
        names = [e[0] for e in writer.pending if e[0].startswith(stages.STEP_META_PREFIX)]
        assert names == ["step_meta: prefill=8 decode=1 total=9 reqs=3"] * 2
        marks = [e for e in writer.pending if e[0] == names[0]]
        assert all(t0 == t1 for _, t0, t1, _ in marks)
    finally:
        tracing.configure("off")


def test_the_observer_is_c_where_built():
    observer = ranges.step_observer()
    assert observer is ranges.step_observer()  # one per process: its counter spans engines
    if ranges._native_steps is not None:
        assert isinstance(observer, ranges._native_steps.StepObserver)
    else:
        assert observer is ranges.step_shape_seen
