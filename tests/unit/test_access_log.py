"""The access log as a file on disk: there within about a second while a process runs, kept by
a killed one up to the last interval, whole and ordered lines from many threads and processes,
and a forked child never writes its parent's lines."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from mmscope.cache_size import trace
from mmscope.carry import access_log
from mmscope.carry.access_log import AccessLogWriter
from mmscope.carry.ledger import Item
from mmscope.errors import UserError

FIELDS = {"C": 5, "A": 10, "F": 4}  # the format's fields per kind (access_log's docstring)


class Line:
    """One line of the file as written, checked whole: the kind's number of fields."""

    def __init__(self, text: str):
        f = text.rstrip("\n").split("\t")
        assert FIELDS.get(f[0]) == len(f), f"a broken line: {text!r}"
        self.kind, self.engine = f[0], f[2]
        self.request = f[3] if f[0] != "C" else ""
        self.item = int(f[4]) if f[0] == "A" else None
        self.outcome = f[8] if f[0] == "A" else ""
        self.capacity = int(f[3]) if f[0] == "C" else None


def read(path) -> list[Line]:
    with open(path) as f:
        return [Line(t) for t in f if not t.startswith("#")]


def an_item(request: str, index: int) -> Item:
    return Item(request, index, "image", f"{request}-{index:08d}" + "0" * 48, 576)


def accesses(path) -> list[Line]:
    return [r for r in read(path) if r.kind == "A"]


# A process that appends lines and then lives on, or sleeps past the interval and kills itself.
WRITING = textwrap.dedent("""
    import os, signal, sys, time
    from mmscope.carry import access_log
    from mmscope.carry.ledger import Item
    w = access_log.writer()
    w.capacity(8192)
    for i in range(100):
        w.item("MISS", Item("early", i, "image", "%064d" % i, 576), None)
    w.freed("early")
    print("written", flush=True)
    if sys.argv[1] == "kill":
        time.sleep(1.5)  # three flush intervals: the early lines are older than a second
        for i in range(20):
            w.item("HIT", Item("late", i, "image", "%064d" % i, 576), "local")
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
""")


def writing(path, how) -> subprocess.Popen:
    env = dict(os.environ, MMSCOPE_ACCESS_LOG=str(path))
    return subprocess.Popen([sys.executable, "-c", WRITING, how], env=env,
                            stdout=subprocess.PIPE, text=True)


def test_lines_reach_the_disk_within_about_a_second_while_the_process_runs(tmp_path):
    path = tmp_path / "access.log"
    proc = writing(path, "live")
    try:
        assert proc.stdout.readline() == "written\n"
        # A bound on the flush interval (0.5 s), with room for a loaded machine, not a speed test.
        deadline = time.monotonic() + 3.0
        records = []
        while time.monotonic() < deadline and len(records) < 102:
            time.sleep(0.1)
            records = read(path)
        assert proc.poll() is None  # still running: no exit handler wrote them
        assert [r.kind for r in records] == ["C"] + ["A"] * 100 + ["F"]
        assert [r.item for r in records if r.kind == "A"] == list(range(100))
        assert records[0].capacity == 8192 and records[-1].request == "early"
    finally:
        proc.kill()
        proc.wait()


def test_a_process_killed_with_sigkill_loses_at_most_the_last_interval(tmp_path):
    path = tmp_path / "access.log"
    proc = writing(path, "kill")
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    records = read(path)  # every line whole
    early = [r for r in records if r.request == "early"]
    assert [r.kind for r in early] == ["A"] * 100 + ["F"]
    assert [r.item for r in early if r.kind == "A"] == list(range(100))
    late = [r.item for r in records if r.request == "late"]
    assert late == list(range(len(late)))  # none, or an unbroken head of them
    assert open(path).read().startswith(access_log.HEADER)


def test_concurrent_writer_threads_keep_every_line_whole_and_each_threads_lines_in_order(tmp_path):
    path = tmp_path / "access.log"
    writer = AccessLogWriter(str(path), "e0")
    per_thread, stop = 5000, threading.Event()

    def produce(k):
        for i in range(per_thread):
            writer.item("MISS", an_item(f"t{k}", i), None)
            if i % 1000 == 0:
                writer.freed(f"t{k}")

    def flush_all_the_time():  # besides the writer's own flush thread
        while not stop.is_set():
            writer.flush()

    flushers = [threading.Thread(target=flush_all_the_time) for _ in range(2)]
    producers = [threading.Thread(target=produce, args=(k,)) for k in range(4)]
    for t in flushers + producers:
        t.start()
    for t in producers:
        t.join()
    stop.set()
    for t in flushers:
        t.join()
    writer.flush()
    records = read(path)
    for k in range(4):
        mine = [r for r in records if r.request == f"t{k}"]
        assert [r.item for r in mine if r.kind == "A"] == list(range(per_thread))
        assert len([r for r in mine if r.kind == "F"]) == per_thread // 1000
    assert open(path).read().count(access_log.HEADER) == 1


def test_several_processes_appending_to_one_file_keep_lines_whole_and_in_order(tmp_path):
    path = tmp_path / "access.log"
    prog = textwrap.dedent("""
        import sys, time
        from mmscope.carry import access_log
        from mmscope.carry.ledger import Item
        w = access_log.writer()
        name = sys.argv[1]
        for i in range(3000):
            w.item("HIT", Item(name, i, "image", name * 8 + "%056d" % i, 576), "local")
            if i % 500 == 0:
                time.sleep(0.3)  # let the flush thread take part of the lines
    """)
    env = dict(os.environ, MMSCOPE_ACCESS_LOG=str(path))
    procs = [subprocess.Popen([sys.executable, "-c", prog, f"p{k}"], env=env) for k in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    records = accesses(path)  # every line whole
    assert len(records) == 4 * 3000
    for k in range(4):
        mine = [r for r in records if r.request == f"p{k}"]
        assert [r.item for r in mine] == list(range(3000))
        assert {r.engine for r in mine} == {str(procs[k].pid)}


def test_a_forked_child_that_exits_normally_never_writes_its_parents_lines(tmp_path):
    path = tmp_path / "access.log"
    prog = textwrap.dedent("""
        import os, sys
        from mmscope.carry import access_log
        from mmscope.carry.ledger import Item
        w = access_log.writer()
        w.item("MISS", Item("parent", 0, "image", "%064d" % 0, 576), None)  # still buffered
        pid = os.fork()
        if pid == 0:
            access_log.writer().item("HIT", Item("child", 0, "image", "%064d" % 1, 576), "local")
            sys.exit(0)  # a normal exit: the exit handlers run in the child
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        print(pid)
    """)
    env = dict(os.environ, MMSCOPE_ACCESS_LOG=str(path))
    out = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    child = out.stdout.split()[-1]
    records = accesses(path)
    assert [(r.request, r.outcome) for r in records if r.request == "parent"] == [
        ("parent", "MISS")]
    assert [(r.request, r.engine) for r in records if r.request == "child"] == [("child", child)]


def test_prefix_covered_outcomes_are_not_written(tmp_path):
    path = tmp_path / "access.log"
    writer = AccessLogWriter(str(path), "e0")
    writer.item("PREFIX_COVERED", an_item("r", 0), None)
    writer.item("MISS", an_item("r", 1), None)
    writer.flush()
    assert [(r.item, r.outcome) for r in accesses(path)] == [(1, "MISS")]


def test_its_reader_names_a_broken_line(tmp_path):
    path = tmp_path / "access.log"
    path.write_text(access_log.HEADER + "A\t1\te0\tr\t0\timage\th\t16\tMISS\t-\n"
                    "A\t2\te0\tr\n")
    with pytest.raises(UserError, match=r"access.log:3: not an access-log line"):
        trace.load(str(path))
