"""Property tests: the nesting equals a brute-force containment oracle, on any intervals.

Random intervals, nsys push/pop and start/end ranges (through real SQLite files) and Chrome X and
B/E events all nest by containment: a parent contains its child, partial overlaps stay apart.
"""
from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mmscope.analyze.readers import chrome, nsys
from mmscope.analyze.ranges.table import nest_with_crossings
from tests.kit import nsys as F


def contains(p, c, slack: int = 0) -> bool:
    """p contains c: p has positive length, p.start <= c.start < p.end, c.end <= p.end + slack."""
    (ps, pe), (cs, ce) = p, c
    return pe > ps and ps <= cs < pe and ce <= pe + slack


def oracle(thread, sub, start, end, slack: int = 0):
    """Every pair compared: the parent is the last range before me, in (start, longest first,
    row) order within my (thread, sub) group, that contains me; depth counts the parent chain;
    a range of positive length crosses when an earlier range after its parent (an earlier
    sibling, or something inside one) ends inside it, more than `slack` after its start."""
    n = len(start)
    key = sorted(range(n), key=lambda i: (start[i], -end[i], i))
    pos = {r: k for k, r in enumerate(key)}
    parent, crossing = [-1] * n, []
    for i in range(n):
        group = (thread[i], sub[i])
        before = [j for j in range(n) if (thread[j], sub[j]) == group and pos[j] < pos[i]]
        holders = [j for j in before
                   if contains((start[j], end[j]), (start[i], end[i]), slack)]
        parent[i] = max(holders, key=pos.get) if holders else -1
        siblings = [j for j in before if pos[j] > pos.get(parent[i], -1)]
        if end[i] > start[i] and any(start[i] + slack < end[j] < end[i] for j in siblings):
            crossing.append(i)
    depth = []
    for i in range(n):
        d, p = 0, parent[i]
        while p >= 0:
            d, p = d + 1, parent[p]
        depth.append(d)
    return depth, parent, crossing


def check(thread, sub, start, end, slack: int = 0) -> None:
    cols = [np.array(c, dtype=np.int64) for c in (thread, sub, start, end)]
    depth, parent, crossing = nest_with_crossings(*cols, slack)
    ref_depth, ref_parent, ref_crossing = oracle(thread, sub, start, end, slack)
    assert parent.tolist() == ref_parent
    assert depth.tolist() == ref_depth
    assert crossing.tolist() == ref_crossing


INTERVAL = st.tuples(st.integers(0, 2), st.integers(0, 1), st.integers(0, 30),
                     st.integers(0, 12))


@settings(max_examples=400, deadline=None)
@given(st.lists(INTERVAL, max_size=40), st.sampled_from([0, 0, 1, 3]))
def test_any_intervals_nest_by_containment(rows, slack):
    """With a slack too: a child may end up to `slack` after its parent (a format's rounding)."""
    thread = [(1 << 48) | (t << 24) | t for t, _, _, _ in rows]
    sub = [s for _, s, _, _ in rows]
    start = [a for _, _, a, _ in rows]
    end = [a + d for _, _, a, d in rows]
    check(thread, sub, start, end, slack)


@settings(max_examples=200, deadline=None)
@given(st.lists(INTERVAL, max_size=30))
def test_no_share_exceeds_its_parent(rows):
    """Whatever overlaps, a range never outlives its parent."""
    thread = np.array([t for t, _, _, _ in rows], np.int64)
    start = np.array([a for _, _, a, _ in rows], np.int64)
    end = start + np.array([d for _, _, _, d in rows], np.int64)
    _, parent, _ = nest_with_crossings(thread, np.zeros(len(rows), np.int64), start, end)
    has = parent >= 0
    assert (start[parent[has]] <= start[has]).all() and (end[has] <= end[parent[has]]).all()


# One thread's history: push, pop, a zero-length range, or the clock moving on (maybe by 0,
# which gives equal ranges, ranges touching end to start and zero-length ones on boundaries).
OPS = st.lists(st.tuples(st.sampled_from("push pop zero tick".split()), st.integers(0, 3)),
               max_size=30)


def push_pop(ops) -> list[tuple[int, int]]:
    clock, stack, rows = 0, [], []
    for op, k in ops:
        if op == "push":
            rows.append([clock, None])
            stack.append(len(rows) - 1)
        elif op == "pop" and stack:
            rows[stack.pop()][1] = clock
        elif op == "zero":
            rows.append([clock, clock])
        else:
            clock += k
    while stack:
        rows[stack.pop()][1] = clock
    return [tuple(r) for r in rows]


def table_columns(t):
    return t.thread.tolist(), t.start.tolist(), t.end.tolist()


def expect_table(t, subs) -> None:
    """subs: 1 for a start/end range, which NVTX lets overlap: never a crossing."""
    thread, start, end = table_columns(t)
    ref_depth, ref_parent, ref_crossing = oracle(thread, subs, start, end)
    assert t.parent.tolist() == ref_parent
    assert t.depth.tolist() == ref_depth
    assert t.crossing.tolist() == [i for i in ref_crossing if not subs[i]]


@settings(max_examples=30, deadline=None)
@given(OPS, st.lists(st.tuples(st.integers(0, 20), st.integers(0, 15)), max_size=12))
def test_nsys_push_pop_and_start_end_ranges(tmp_path_factory, ops, spans):
    """Push/pop ranges nest as a stack; start/end ranges (type 60) overlap freely (no partial
    overlap is a crossing) and nest among themselves by containment, on the same thread."""
    path = tmp_path_factory.mktemp("n") / "n.sqlite"
    with F.NsysFile(path) as f:
        for s, e in push_pop(ops):
            f.range("pp", s, e, pid=7)
        for s, d in spans:
            f.start_end("se", s, s + d, pid=7)
    t = nsys.load(str(path))
    subs = [int(k) for k in (t.kind == 1)]
    expect_table(t, subs)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 20), st.integers(0, 10)),
                max_size=15), OPS)
def test_chrome_x_and_b_e_events(tmp_path_factory, xs, ops):
    """Complete events overlap as they were recorded (the torch profiler's pairs of a call and
    the range it opens); B/E pairs close on their thread's stack."""
    events = [{"ph": "X", "name": "x", "ts": s, "dur": d, "pid": 1, "tid": tid}
              for tid, s, d in xs]
    for s, e in push_pop(ops):
        events.append({"ph": "B", "name": "b", "ts": s, "pid": 1, "tid": 5})
        events.append({"ph": "E", "ts": e, "pid": 1, "tid": 5, "order": s})
    # B/E as a writer emits them: in time order, an E before a B at the same time closing a
    # range that ended there, inner ends before outer ones.
    bs = [e for e in events if e["ph"] == "B"]
    es = [e for e in events if e["ph"] == "E"]
    timeline = sorted([(e["ts"], 1, -i, e) for i, e in enumerate(bs)]
                      + [(e["ts"], 0, i, e) for i, e in enumerate(es)],
                      key=lambda x: x[:3])
    ordered = [e for e in events if e["ph"] == "X"] + [x[3] for x in timeline]
    path = tmp_path_factory.mktemp("c") / "t.json"
    path.write_text(json.dumps({"traceEvents": ordered}))
    t = chrome.load(str(path))
    expect_table(t, [0] * len(t))


def test_the_torch_profiler_call_that_opens_a_scope_is_not_its_parent():
    """A 34.5 µs `_record_function_enter_new` that starts 8 µs before `forward` and ends inside
    it: neither contains the other, both stay on one level, and the overlap is counted."""
    start = [0, 8_000, 9_000]
    end = [34_500, 1_132_091_741, 20_000]
    depth, parent, crossing = nest_with_crossings(
        np.zeros(3, np.int64), np.zeros(3, np.int64), np.array(start), np.array(end))
    assert parent.tolist() == [-1, -1, 1]  # inside both: the later one holds it
    assert depth.tolist() == [0, 0, 1]
    assert crossing.tolist() == [1]
