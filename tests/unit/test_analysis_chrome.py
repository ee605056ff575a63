"""Chrome trace JSON (X, B/E, instants, gzip, bare list, torch-profiler extras) loads to the same
range table as the equivalent nsys SQLite file."""
from __future__ import annotations

import gzip
import json

import pytest

from tests.kit import nsys as F
from mmscope import stages
from mmscope.analyze.readers import chrome, nsys
from mmscope.analyze import load
from mmscope.errors import UserError

META = stages.step_meta_range(stages.StepShape(2, 1, 3, 2))
# (name, start ns, end ns or None for unclosed, pid, tid); marks have end == "mark".
RANGES = [
    ("api", 0, 700, 20, 20),
    (stages.PREPROCESS, 1000, 5000, 10, 11),
    (stages.VIT_FORWARD, 1234, 3000, 10, 11),
    (stages.EC_SAVE, 3000, 3500, 10, 11),
    ("probe", 3200, "mark", 10, 11),
    (META, 6000, 6000, 10, 11),
    (stages.FORWARD, 6100, 9000, 10, 11),
    ("late", 8000, None, 20, 20),
]
THREADS = {(10, 11): "worker", (20, 20): "api-thread"}
PROCESSES = {10: "EngineCore", 20: "api_server"}


def nsys_file(path) -> str:
    with F.NsysFile(path) as f:
        f.vm = 0
        for (pid, tid), name in THREADS.items():
            f.thread_name(name, pid, tid)
        for pid, name in PROCESSES.items():
            f.process(pid, name)
        for name, start, end, pid, tid in RANGES:
            if end == "mark":
                f.mark(name, start, pid=pid, tid=tid)
            else:
                f.range(name, start, end, pid=pid, tid=tid)
    return str(path)


def metadata() -> list[dict]:
    out = [{"ph": "M", "name": "thread_name", "pid": p, "tid": t, "args": {"name": n}}
           for (p, t), n in THREADS.items()]
    return out + [{"ph": "M", "name": "process_name", "pid": p, "tid": 0, "args": {"name": n}}
                  for p, n in PROCESSES.items()]


def x_events() -> list[dict]:
    out = []
    for name, start, end, pid, tid in RANGES:
        if end == "mark":
            out.append({"name": name, "ph": "i", "s": "t", "ts": start / 1000, "pid": pid,
                        "tid": tid})
        elif end is None:
            out.append({"name": name, "ph": "B", "ts": start / 1000, "pid": pid, "tid": tid})
        else:
            out.append({"name": name, "ph": "X", "ts": start / 1000, "dur": (end - start) / 1000,
                        "pid": pid, "tid": tid})
    return out


def be_events() -> list[dict]:
    """The same ranges as begin/end pairs, in time order (ends before begins at equal times)."""
    timed = []
    for i, ev in enumerate(x_events()):
        if ev["ph"] != "X":
            timed.append((ev["ts"], 1, i, ev))
            continue
        b = {k: v for k, v in ev.items() if k != "dur"} | {"ph": "B"}
        e = {"ph": "E", "ts": ev["ts"] + ev["dur"], "pid": ev["pid"], "tid": ev["tid"]}
        timed += [(ev["ts"], 1, i, b), (e["ts"], 2 if ev["dur"] == 0 else 0, -i, e)]
    return [ev for *_, ev in sorted(timed, key=lambda x: x[:3])]


def same(a, b) -> None:
    assert a.data_frame().equals(b.data_frame())
    assert a.thread_names == b.thread_names
    assert a.process_names == b.process_names


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return nsys.load(nsys_file(tmp_path_factory.mktemp("c") / "ref.sqlite"))


def test_reference_is_what_the_fixture_says(reference):
    t = reference
    assert len(t) == len(RANGES)
    late = [i for i in range(len(t)) if t.name_of(i) == "late"][0]
    assert t.unclosed[late] and t.end[late] == 9000


def test_x_events_object(tmp_path, reference):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"traceEvents": metadata() + x_events(), "displayTimeUnit": "ns"}))
    same(load(str(path)), reference)


def test_begin_end_bare_list(tmp_path, reference):
    path = tmp_path / "be.json"
    path.write_text(json.dumps(metadata() + be_events()))
    same(chrome.load(str(path)), reference)


def test_gzip(tmp_path, reference):
    path = tmp_path / "x.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": x_events() + metadata()}).encode()))
    same(load(str(path)), reference)


def test_torch_profiler_extras_are_ignored(tmp_path, reference):
    extra = [{"ph": "C", "name": "mem", "ts": 1, "pid": 10, "args": {"v": 1}},
             {"ph": "s", "id": 1, "name": "flow", "ts": 2, "pid": 10, "tid": 11, "cat": "ac2g"},
             {"ph": "E", "ts": 99, "pid": 30, "tid": 30}]  # an E whose B was cut off
    events = [dict(ev, cat="user_annotation", args={"External id": 3}) for ev in x_events()]
    path = tmp_path / "torch.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": metadata() + events + extra,
                                "deviceProperties": []}))
    same(load(str(path)), reference)


def test_mmscope_chrome_backend_file(tmp_path):
    """The document the `chrome` tracing backend writes, read back to the nanosecond."""
    from mmscope.emit.chrome import ChromeTraceWriter

    t0 = 1_234_567_890_123
    events = [(stages.PREPROCESS, t0, t0 + 5_001, 77), (stages.VIT_FORWARD, t0 + 7, t0 + 2_999, 77),
              (META, t0 + 6_000, t0 + 6_000, 77)]
    path = tmp_path / "mmscope.trace.json"
    writer = ChromeTraceWriter(str(path))
    pid = writer.pid
    writer.thread_names, writer._new_threads, writer.pending = {77: "MainThread"}, [77], events
    writer.flush()  # unterminated, as a killed process leaves it
    t = load(str(path))
    assert [(t.name_of(i), int(t.start[i]), int(t.end[i]), int(t.depth[i])) for i in range(3)] \
        == [(stages.PREPROCESS, t0, t0 + 5_001, 0), (stages.VIT_FORWARD, t0 + 7, t0 + 2_999, 1),
            (META, t0 + 6_000, t0 + 6_000, 0)]
    assert t.process[0] == pid and t.thread_names == {(pid << 24) | 77: "MainThread"}


def test_string_ids_get_stand_ins(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"ph": "X", "name": "k", "ts": 1, "dur": 1, "pid": "gpu 0",
                                 "tid": "stream 7"}]))
    t = load(str(path))
    assert len(t) == 1 and t.thread[0] > 0


@pytest.mark.parametrize("doc", [{"foo": 1}, [1, 2], {"traceEvents": "x"}, [{"name": "a"}]])
def test_json_that_is_not_a_trace(tmp_path, doc):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(UserError, match="not a Chrome trace"):
        load(str(path))


def test_a_folder_of_per_process_traces_is_one_profile(tmp_path):
    """mmscope's chrome backend writes one file per process; the folder analyses as one run."""
    from mmscope.analyze.readers.formats import load_profile

    for pid, name in ((101, stages.PREPROCESS), (202, stages.FORWARD)):
        (tmp_path / f"mmscope-{pid}.trace.json").write_text(json.dumps(
            [{"name": name, "ph": "X", "ts": 1.0, "dur": 2.0, "pid": pid, "tid": pid}]))
    t = load_profile(str(tmp_path))
    assert sorted(t.name_of(i) for i in range(len(t))) == sorted([stages.PREPROCESS, stages.FORWARD])
    assert sorted(set(t.process.tolist())) == [101, 202]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="a folder without Chrome trace files"):
        load_profile(str(empty))


# --- clocks: each file's is known; a folder is one profile only on one clock ------------------
def torch_trace(path, base_ns: int, pid: int, spans) -> None:
    """A torch profiler trace as Kineto writes it: times relative to its base on UTC."""
    path.write_text(json.dumps({
        "schemaVersion": 1, "deviceProperties": [], "baseTimeNanoseconds": base_ns,
        "traceEvents": [{"ph": "X", "cat": "user_annotation", "name": name, "ts": s / 1000,
                         "dur": (e - s) / 1000, "pid": pid, "tid": pid} for name, s, e in spans]}))


def test_clock_of_each_kind_of_file(tmp_path):
    from mmscope.emit.chrome import ChromeTraceWriter

    ours = tmp_path / "mmscope.trace.json"
    writer = ChromeTraceWriter(str(ours))
    writer.pending = [(stages.FORWARD, 10, 20, 1)]
    writer._new_threads = []
    writer.flush()
    doc = chrome._parse(str(ours))
    clock = chrome.clock_of(doc, chrome._events(str(ours), doc))
    assert clock.domain == "CLOCK_MONOTONIC" and isinstance(clock.wall_offset_ns, int)
    torch_trace(tmp_path / "torch.json", 1_700_000_000_000_000_000, 5, [("a", 0, 10)])
    doc = chrome._parse(str(tmp_path / "torch.json"))
    assert chrome.clock_of(doc, doc["traceEvents"]) == chrome.Clock(
        chrome.TORCH, 1_700_000_000_000_000_000)
    assert load(str(tmp_path / "torch.json")).clock == chrome.TORCH


def test_torch_traces_of_several_ranks_align_on_their_base_times(tmp_path):
    from mmscope.analyze.readers.formats import load_profile

    base = 1_700_000_000_000_000_000
    torch_trace(tmp_path / "rank0.json", base, 100, [(stages.FORWARD, 1_000, 5_000)])
    torch_trace(tmp_path / "rank1.json", base + 250, 200, [(stages.FORWARD, 1_000, 5_000)])
    t = load_profile(str(tmp_path))
    assert sorted(int(s) for s in t.start) == [base + 1_000, base + 1_250]
    assert t.clock.startswith("UTC")


def test_a_torch_trace_beside_mmscope_traces_is_refused(tmp_path):
    """Two recordings of the same run on two clocks: refused in one line, not merged (which
    gave a 61-day span and every forward twice)."""
    import subprocess
    import sys

    from mmscope.analyze.readers.formats import load_profile
    from mmscope.emit.chrome import ChromeTraceWriter

    torch_trace(tmp_path / "torch.json", 1_700_000_000_000_000_000, 9,
                [(stages.FORWARD, 1_000, 5_000)])
    writer = ChromeTraceWriter(str(tmp_path / "mmscope-9.trace.json"))
    writer.pending = [(stages.FORWARD, 5_270_400_000_000_000, 5_270_400_000_004_000, 9)]
    writer._new_threads = []
    writer.flush()
    with pytest.raises(UserError, match="traces on different clocks .*analyze each on its own"):
        load_profile(str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "mmscope.cli", "analyze", str(tmp_path),
                           "--no-cache"], capture_output=True, text=True)
    assert done.returncode != 0 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("mmscope: error: ") and "different clocks" in done.stderr
