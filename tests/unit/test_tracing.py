"""Tracing backends: the Chrome file that was written, parsed back; off and nvtx selection."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from mmscope.emit import tracing
from mmscope.emit import chrome as chrome_writer
from mmscope.emit.chrome import ChromeTraceWriter, read_events


@pytest.fixture
def chrome(tmp_path):
    tracing.configure("chrome", str(tmp_path))
    yield tmp_path
    tracing.configure("off")


def _load(trace_dir):
    files = [f for f in os.listdir(trace_dir) if f.endswith(".trace.json")]
    assert len(files) == 1, files
    with open(os.path.join(trace_dir, files[0])) as f:
        doc = read_events(f.read())
    complete = [e for e in doc if e["ph"] == "X"]
    meta = [e for e in doc if e["ph"] == "M"]
    return complete, meta


def test_parse_spec():
    assert tracing.parse_spec("") == ()
    assert tracing.parse_spec("off") == ()
    assert tracing.parse_spec("nvtx,chrome") == ("nvtx", "chrome")
    assert tracing.parse_spec("chrome", vllm_nvtx=True) == ("nvtx", "chrome")
    assert tracing.parse_spec("torch") == ("torch",)
    assert tracing.parse_spec("chrome", vllm_torch=True) == ("chrome", "torch")
    assert tracing.parse_spec("torch,chrome,torch") == ("torch", "chrome")
    with pytest.raises(ValueError, match=r"unknown tracing backend 'perfetto' "
                                         r"\(choose from off, nvtx, chrome, torch\)"):
        tracing.parse_spec("perfetto")


def test_unknown_backend_leaves_tracing_off():
    assert tracing.configure("bogus") == ()
    assert tracing.active() == ()


def test_off_writes_nothing(tmp_path):
    tracing.configure("off", str(tmp_path))
    with tracing.span("a"):
        tracing.mark("m")
    tracing.flush()
    assert os.listdir(tmp_path) == []


def test_chrome_nesting_durations_and_mark(chrome):
    t0 = time.perf_counter_ns()
    with tracing.span("outer"):
        time.sleep(0.02)
        with tracing.span("inner"):
            time.sleep(0.01)
            tracing.mark("step_meta: prefill=1 decode=0 total=1 reqs=1")
    elapsed_us = (time.perf_counter_ns() - t0) / 1000
    tracing.flush()
    events, meta = _load(chrome)
    by_name = {e["name"]: e for e in events}
    assert set(by_name) == {"outer", "inner", "step_meta: prefill=1 decode=0 total=1 reqs=1"}
    outer, inner, mark = (by_name["outer"], by_name["inner"],
                          by_name["step_meta: prefill=1 decode=0 total=1 reqs=1"])
    assert 30_000 <= outer["dur"] <= elapsed_us
    assert 10_000 <= inner["dur"] < outer["dur"]
    assert outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]
    assert mark["dur"] == 0 and inner["ts"] <= mark["ts"] <= inner["ts"] + inner["dur"]
    assert {e["pid"] for e in events} == {os.getpid()}
    assert {"process_name", "thread_name"} <= {m["name"] for m in meta}


def test_chrome_threads_get_own_tracks(chrome):
    def work(x):
        with tracing.span("work"):
            return x * 2

    results = []
    threads = [threading.Thread(target=lambda: results.append(work(3)), name=f"t{i}")
               for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert work(1) == 2 and results == [6, 6]
    tracing.flush()
    events, meta = _load(chrome)
    tids = {e["tid"] for e in events if e["name"] == "work"}
    assert len(tids) == 3  # main thread + two workers, each on its own track
    names = {m["args"]["name"] for m in meta if m["name"] == "thread_name"}
    assert {"t0", "t1", "MainThread"} <= names


def test_span_exception_closes_range_and_propagates(chrome):
    with pytest.raises(KeyError):
        with tracing.span("boom"):
            raise KeyError("x")
    tracing.flush()
    events, _ = _load(chrome)
    assert [e["name"] for e in events] == ["boom"]


def test_chrome_file_stays_valid_when_killed(tmp_path):
    """A process killed after a flush leaves the last complete file, never a half-written one."""
    prog = textwrap.dedent("""
        import os, signal, sys
        from mmscope.emit import tracing
        for i in range(1000):
            with tracing.span(f"s{i % 3}"):
                pass
        tracing.flush()
        for i in range(5):
            with tracing.span("after"):
                pass
        print("ready", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = dict(os.environ, MMSCOPE_TRACE="chrome", MMSCOPE_TRACE_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    events, _ = _load(tmp_path)
    names = [e["name"] for e in events]
    # everything flushed, no half event (the timed flush may have taken some of the last five)
    assert len([n for n in names if n != "after"]) == 1000 and names.count("after") <= 5
    text = next(tmp_path.glob("*.trace.json")).read_text()
    assert text.startswith("[\n") and text.endswith("},\n")  # the unterminated array form


def test_chrome_flushes_at_exit_one_file_per_process(tmp_path):
    prog = textwrap.dedent("""
        import multiprocessing as mp
        from mmscope.emit import tracing
        def child():
            with tracing.span("child"):
                pass
        if __name__ == "__main__":
            with tracing.span("parent"):
                p = mp.get_context("spawn").Process(target=child); p.start(); p.join()
    """)
    script = tmp_path / "prog.py"
    script.write_text(prog)
    out = tmp_path / "traces"
    env = dict(os.environ, MMSCOPE_TRACE="chrome", MMSCOPE_TRACE_DIR=str(out))
    subprocess.run([sys.executable, str(script)], env=env, check=True)
    files = sorted(os.listdir(out))
    assert len(files) == 2
    names = set()
    for f in files:
        doc = json.loads((out / f).read_text())  # closed at exit: strict JSON
        names |= {e["name"] for e in doc if e["ph"] == "X"}
    assert names == {"parent", "child"}


def test_vllm_nvtx_switch_turns_nvtx_on(monkeypatch):
    monkeypatch.setenv("VLLM_NVTX_SCOPES_FOR_PROFILING", "1")
    try:
        assert tracing.configure("") == ("nvtx",)
        with tracing.span("x"):  # no tool attached: a no-op that must not fail
            tracing.mark("m")
    finally:
        monkeypatch.delenv("VLLM_NVTX_SCOPES_FOR_PROFILING")
        tracing.configure("off")


def test_chrome_keeps_nanoseconds_and_thread_ids_exactly(tmp_path):
    from mmscope.emit.chrome import ChromeTraceWriter

    path = str(tmp_path / "t.trace.json")
    writer = ChromeTraceWriter(path)
    writer.complete('quote " and \\ name', 1_234_567_891, 1_234_569_000)
    writer.complete("zero", 5, 5)
    other = []

    def on_thread():
        other.append(threading.get_native_id())
        writer.complete("elsewhere", 7_000, 9_001)

    t = threading.Thread(target=on_thread, name="worker-x")
    t.start()
    t.join()
    writer.close()
    text = open(path).read()
    assert '"ts":1234567.891,"dur":1.109' in text and '"ts":0.005,"dur":0.000' in text
    doc = json.loads(text)  # closed: strict JSON
    events = {e["name"]: e for e in doc if e["ph"] == "X"}
    assert events['quote " and \\ name']["tid"] == threading.get_native_id()
    assert events["elsewhere"]["tid"] == other[0] != threading.get_native_id()
    names = {e["tid"]: e["args"]["name"] for e in doc if e["name"] == "thread_name"}
    assert names[other[0]] == "worker-x"


def test_chrome_loses_no_event_appended_while_flushing(tmp_path):
    from mmscope.emit.chrome import ChromeTraceWriter

    path = str(tmp_path / "t.trace.json")
    writer = ChromeTraceWriter(path)
    per_thread, stop = 20_000, threading.Event()

    def produce(k):
        for i in range(per_thread):
            writer.complete(f"t{k}", i, i + 1)

    def flush_all_the_time():
        while not stop.is_set():
            writer.flush()

    flusher = threading.Thread(target=flush_all_the_time)
    flusher.start()
    producers = [threading.Thread(target=produce, args=(k,)) for k in range(4)]
    for t in producers:
        t.start()
    for t in producers:
        t.join()
    stop.set()
    flusher.join()
    writer.close()
    doc = json.loads(open(path).read())
    counts = {}
    for e in doc:
        if e["ph"] == "X":
            counts[e["name"]] = counts.get(e["name"], 0) + 1
    assert counts == {f"t{k}": per_thread for k in range(4)}
    assert len([e for e in doc if e["name"] == "thread_name"]) == 4


def test_the_formatter_keeps_every_nanosecond_and_escapes_every_name():
    import random

    from mmscope.emit import chrome

    rng = random.Random(7)
    names = ["gpu_model_runner: forward", 'odd "name" \\ é 画像', "x"]
    quoted = {n: json.dumps(n) for n in names}
    events = [(rng.choice(names), t0, t0 + rng.choice([0, 1, 999, 1000, 1001, 10**9 + 7]),
               rng.randint(1, 2**31)) for t0 in [rng.randint(0, 2**62) for _ in range(2000)]]
    text = chrome.format_events(events, quoted, 4242).decode()
    assert text.endswith("},\n")
    parsed = json.loads("[" + text.rstrip(",\n") + "]")
    assert len(parsed) == len(events)
    for e, (name, t0, t1, tid) in zip(parsed, events):
        assert (e["name"], e["ph"], e["pid"], e["tid"]) == (name, "X", 4242, tid)
    # microseconds with three decimals: the text holds the nanoseconds exactly
    lines = text.splitlines()
    for line, (_, t0, t1, _) in zip(lines, events):
        ts, dur = divmod(t0, 1000), divmod(t1 - t0, 1000)
        assert f'"ts":{ts[0]}.{ts[1]:03d},"dur":{dur[0]}.{dur[1]:03d}' in line


def test_the_file_opens_with_the_process_name_and_the_clock(tmp_path):
    writer = ChromeTraceWriter(str(tmp_path / "t.trace.json"))
    writer.complete("a", 10, 20)
    writer.close()
    doc = json.loads(open(writer.path).read())
    assert [e["name"] for e in doc[:2]] == ["process_name", "clock"]
    clock = doc[1]["args"]
    assert clock["clock"] == "CLOCK_MONOTONIC" and clock["producer"] == "mmscope"
    assert abs(clock["wall_minus_clock_ns"] + time.perf_counter_ns() - time.time_ns()) < 60e9
    assert doc[-1]["name"] == "trace_end" and doc[-1]["args"]["dropped_events"] == 0


# A process that spans and then lives on (or kills itself) without flushing by hand.
SPANNING = textwrap.dedent("""
    import os, signal, sys, time
    from mmscope.emit import tracing
    for i in range(200):
        with tracing.span(f"early{i % 4}"):
            pass
    print("spanned", flush=True)
    if sys.argv[1] == "kill":
        time.sleep(1.5)  # three flush intervals: the early spans are older than a second
        for i in range(50):
            with tracing.span("late"):
                pass
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
""")


def _spanning(tmp_path, how):
    env = dict(os.environ, MMSCOPE_TRACE="chrome", MMSCOPE_TRACE_DIR=str(tmp_path))
    return subprocess.Popen([sys.executable, "-c", SPANNING, how], env=env,
                            stdout=subprocess.PIPE, text=True)


def test_chrome_events_reach_the_disk_within_about_a_second_while_the_process_runs(tmp_path):
    proc = _spanning(tmp_path, "live")
    try:
        assert proc.stdout.readline() == "spanned\n"
        # A bound on the flush interval (0.5 s), with room for a loaded machine, not a speed test.
        deadline = time.monotonic() + 3.0
        events = []
        while time.monotonic() < deadline and len(events) < 200:
            time.sleep(0.1)
            if list(tmp_path.glob("*.trace.json")):
                events, _ = _load(tmp_path)
        assert len(events) == 200 and proc.poll() is None  # on disk, the process still running
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_process_leaves_a_readable_trace_with_every_event_older_than_a_second(tmp_path):
    proc = _spanning(tmp_path, "kill")
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    events, meta = _load(tmp_path)  # the unterminated array parses
    names = [e["name"] for e in events]
    assert sorted(n for n in names if n.startswith("early")) == sorted(
        f"early{i % 4}" for i in range(200))
    assert set(names) <= {"early0", "early1", "early2", "early3", "late"}
    assert [m["name"] for m in meta[:2]] == ["process_name", "clock"]


def test_chrome_keeps_a_bounded_set_of_quoted_names(tmp_path, monkeypatch):
    """step_meta names change with every batch shape: a long run must not keep them all."""
    monkeypatch.setattr(chrome_writer, "MAX_QUOTED", 4)
    writer = ChromeTraceWriter(str(tmp_path / "t.trace.json"))
    names = [f"step_meta: prefill={i} decode=0 total={i} reqs=1" for i in range(30)]
    for k in range(0, 30, 3):
        for name in names[k:k + 3]:
            writer.complete(name, 1000, 2000)
        writer.flush()
        assert len(writer._quoted) <= 4 + 3
    writer.close()
    doc = json.loads(open(writer.path).read())
    assert [e["name"] for e in doc if e["ph"] == "X"] == names
