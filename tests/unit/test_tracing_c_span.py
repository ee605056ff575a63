"""The chrome backend's C span (tracing.span_factory()): the files it writes, parsed back, against
the Python span's; thread names across writers and forks, drops, misuse, the fallback without it."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from mmscope.emit import tracing
from mmscope.emit.tracing import chrome
from mmscope.emit.chrome import ChromeTraceWriter, read_events

# pip install builds the C span on Linux (setup.py); elsewhere it is optional and span_factory()
# hands out the Python span, which the rest of the suite covers.
pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") and chrome._CSpanFactory is None,
    reason="the optional C span was not built on this non-Linux machine")


def test_the_c_span_is_built_on_linux():
    # On Linux its absence (or a build of the extension without it) is a build failure.
    assert chrome._CSpanFactory is not None


@pytest.fixture
def traced(tmp_path):
    """Configure chrome into a fresh folder (a new writer) and load what it wrote."""
    def configure(name="trace"):
        folder = tmp_path / name
        tracing.configure("chrome", str(folder))
        return folder
    yield configure
    tracing.configure("off")


def _load(folder):
    files = [f for f in os.listdir(folder) if f.endswith(".trace.json")]
    assert len(files) == 1, files
    with open(os.path.join(folder, files[0])) as f:
        doc = read_events(f.read())
    events = [e for e in doc if e["ph"] == "X"]
    threads = [(e["tid"], e["args"]["name"]) for e in doc if e["name"] == "thread_name"]
    return events, threads


def _workload(make):
    """Nested spans, a mark inside, and one span whose block raises; returns perf_counter_ns
    readings taken around and inside the spans."""
    clock = [time.perf_counter_ns()]
    with make("outer"):
        clock.append(time.perf_counter_ns())
        time.sleep(0.01)
        with make("inner"):
            time.sleep(0.005)
            tracing.mark("step_meta: x")
        clock.append(time.perf_counter_ns())
    clock.append(time.perf_counter_ns())
    with pytest.raises(KeyError):
        with make("boom"):
            raise KeyError("x")
    return clock


def test_span_factory_follows_the_configuration(tmp_path):
    try:
        tracing.configure("off")
        assert tracing.span_factory() is tracing.span
        tracing.configure("chrome", str(tmp_path / "a"))
        first = tracing.span_factory()
        assert isinstance(first, chrome._CSpanFactory)
        tracing.configure("chrome", str(tmp_path / "a"))
        assert tracing.span_factory() is first  # the same writer: the same factory
        tracing.configure("chrome", str(tmp_path / "b"))
        assert tracing.span_factory() is not first
        assert tracing.span_factory().pending is tracing._backends[0].writer.pending
        # NVTX with no tool attached records nothing: chrome is the only live backend.
        tracing.configure("nvtx,chrome", str(tmp_path / "b"))
        assert isinstance(tracing.span_factory(), chrome._CSpanFactory)
        # Two live backends: only the Python span feeds both.
        from mmscope.emit.backends import ChromeBackend
        tracing._install((ChromeBackend(str(tmp_path / "c")), ChromeBackend(str(tmp_path / "d"))))
        assert tracing.span_factory() is tracing.span
    finally:
        tracing.configure("off")
    assert tracing.span_factory() is tracing.span


def test_c_span_trace_nesting_durations_clock_and_threads(traced):
    folder = traced()
    make = tracing.span_factory()
    clock = _workload(make)
    tracing.flush()
    events, threads = _load(folder)
    # In the file in the order the spans closed, interleaved with the Python path's mark.
    assert [e["name"] for e in events] == ["step_meta: x", "inner", "outer", "boom"]
    by = {e["name"]: e for e in events}
    outer, inner, mark = by["outer"], by["inner"], by["step_meta: x"]
    assert 15_000 <= outer["dur"] and 5_000 <= inner["dur"] < outer["dur"]
    assert outer["ts"] <= inner["ts"] <= mark["ts"] <= inner["ts"] + inner["dur"] \
        <= outer["ts"] + outer["dur"]
    # The same clock as time.perf_counter_ns: the C readings fall between the Python ones.
    us = [c / 1000 for c in clock]
    assert us[0] <= outer["ts"] <= us[1] and us[2] <= outer["ts"] + outer["dur"] <= us[3]
    assert {(e["pid"], e["tid"]) for e in events} == {(os.getpid(), threading.get_native_id())}
    assert threads == [(threading.get_native_id(), threading.current_thread().name)]


def test_c_span_on_other_threads_and_after_a_new_writer(traced):
    def spans_on_threads(make):
        def work():
            with make("work"):
                pass
        workers = [threading.Thread(target=work, name=f"c-worker-{i}") for i in range(2)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        with make("main"):
            pass
        tracing.flush()
        return {t.native_id: t.name for t in workers}

    for name in ("first", "second"):  # the second writer must learn the main thread anew
        folder = traced(name)
        workers = spans_on_threads(tracing.span_factory())
        events, threads = _load(folder)
        main = threading.get_native_id()
        assert sorted(threads) == sorted([*workers.items(), (main, threading.current_thread().name)])
        assert sorted(e["tid"] for e in events if e["name"] == "work") == sorted(workers)
        assert [e["tid"] for e in events if e["name"] == "main"] == [main]


def test_a_thread_switching_writers_is_named_once_in_each(tmp_path):
    writers = [ChromeTraceWriter(str(tmp_path / f"w{i}.trace.json")) for i in range(2)]
    factories = [w.c_span_factory() for w in writers]
    for _ in range(3):
        for f in factories:
            with f("x"):
                pass
    for w in writers:
        w.close()
        doc = json.loads(open(w.path).read())
        assert len([e for e in doc if e["ph"] == "X"]) == 3
        assert [e["tid"] for e in doc if e["name"] == "thread_name"] == [threading.get_native_id()]


def test_c_and_python_paths_write_the_same_line(tmp_path):
    writer = ChromeTraceWriter(str(tmp_path / "t.trace.json"))
    with writer.c_span_factory()('a "quoted" \\ 名前'):
        pass
    event = writer.pending[0]
    name, t0, t1, tid = event
    assert [type(v) for v in event] == [str, int, int, int] and tid == threading.get_native_id()
    writer.complete(name, t0, t1)  # the Python path, the same thread and times
    assert writer.pending == [event, event]
    writer.close()
    lines = [line for line in open(writer.path) if '"ph":"X"' in line]
    assert len(lines) == 2 and lines[0] == lines[1]
    assert json.loads(lines[0].rstrip(",\n"))["name"] == name


def test_forked_child_records_its_own_thread_id(tmp_path):
    """The thread id is cached per thread in C; a forked child has a new one."""
    prog = textwrap.dedent("""
        import os, sys
        from mmscope.emit import tracing
        make = tracing.span_factory()
        with make("parent"):
            pass
        pid = os.fork()
        if pid == 0:
            tracing.configure("chrome", sys.argv[1])  # the child's own writer and file
            with tracing.span_factory()("child"):
                pass
            tracing.flush()
            os._exit(0)
        os.waitpid(pid, 0)
        print(pid)
    """)
    env = dict(os.environ, MMSCOPE_TRACE="chrome", MMSCOPE_TRACE_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", prog, str(tmp_path)], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    child = int(proc.stdout.split()[-1])
    events = {}
    for path in tmp_path.glob("*.trace.json"):
        doc = read_events(path.read_text())
        for e in doc:
            if e["ph"] == "X" or e["name"] == "thread_name":
                events.setdefault(e["name"], []).append((e["pid"], e["tid"]))
    assert events["child"] == [(child, child)]  # a main thread's id is its process id
    assert (child, child) in events["thread_name"]
    assert events["parent"][0][0] == events["parent"][0][1] != child


def test_drops_beyond_max_pending_are_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(chrome, "MAX_PENDING", 5)
    writer = ChromeTraceWriter(str(tmp_path / "t.trace.json"))
    make = writer.c_span_factory()
    for i in range(8):
        with make(f"c{i}"):
            pass
    writer.complete("py", 1, 2)
    assert len(writer.pending) == 5 and writer.dropped == 4
    writer.close()
    doc = json.loads(open(writer.path).read())
    assert [e["name"] for e in doc if e["ph"] == "X"] == [f"c{i}" for i in range(5)]
    assert doc[-1]["args"]["dropped_events"] == 4


def test_exception_inside_the_with_propagates(traced):
    folder = traced()
    make = tracing.span_factory()
    with pytest.raises(ZeroDivisionError):
        with make("div"):
            1 / 0
    with contextlib.ExitStack() as stack:  # enters through type(cm).__enter__(cm)
        assert stack.enter_context(make("stacked")).name == "stacked"
    with pytest.raises(ValueError):
        with contextlib.ExitStack() as stack:
            stack.enter_context(make("stacked-raising"))
            raise ValueError
    tracing.flush()
    events, _ = _load(folder)
    assert [e["name"] for e in events] == ["div", "stacked", "stacked-raising"]


def test_misuse_raises_or_does_nothing(traced):
    folder = traced()
    make = tracing.span_factory()
    s = make("reused")
    assert s.__exit__(None, None, None) is False  # exit without enter: nothing recorded
    with s as entered:
        assert entered is s
        with pytest.raises(RuntimeError, match="already open"):
            s.__enter__()
    with s:  # closed spans may open again
        pass
    with pytest.raises(TypeError):
        make(42)
    with pytest.raises(TypeError):
        make()
    with pytest.raises(TypeError):
        s(1)
    tracing.flush()
    events, _ = _load(folder)
    assert [e["name"] for e in events] == ["reused", "reused"]


def test_without_the_c_span_the_python_span_writes_the_same_events(traced, monkeypatch):
    def shape(folder):
        events, threads = _load(folder)
        return [(e["name"], e["pid"], e["tid"]) for e in events], threads

    folder = traced("c")
    assert tracing.span_factory() is not tracing.span
    _workload(tracing.span_factory())
    tracing.flush()
    monkeypatch.setattr(chrome, "_CSpanFactory", None)  # as where the extension lacks it
    fallback = traced("python")
    assert tracing.span_factory() is tracing.span
    _workload(tracing.span_factory())
    tracing.flush()
    assert shape(folder) == shape(fallback)


def test_the_factory_marks_zero_duration_events(traced, monkeypatch):
    folder = traced()
    mark = tracing._mark  # what the C step observer calls for step_meta
    assert mark == tracing.span_factory().mark
    before = time.perf_counter_ns()
    mark("step_meta: prefill=1 decode=0 total=1 reqs=1")
    after = time.perf_counter_ns()
    with pytest.raises(TypeError):
        mark(7)
    tracing.flush()
    events, threads = _load(folder)
    assert [(e["name"], e["dur"]) for e in events] == [
        ("step_meta: prefill=1 decode=0 total=1 reqs=1", 0)]
    assert before / 1000 <= events[0]["ts"] <= after / 1000
    assert events[0]["tid"] == threading.get_native_id() and len(threads) == 1
    # A full pending list counts the mark as dropped, like a span.
    factory = tracing.span_factory()
    monkeypatch.setattr(factory, "max_pending", 0)
    mark("dropped")
    assert factory.dropped == 1 and factory.pending == []
    tracing.configure("off")
    assert tracing._mark is tracing.mark  # off: the backends' loop over nothing
