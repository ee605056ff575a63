"""Property test: the vectorized nesting equals a plain stack walk on random well-nested ranges.

The stack rule is the definition: sort by (start, end descending, row); pop while the top does not
contain the range; a positive-length p contains c when p.start <= c.start < p.end, c.end <= p.end.
"""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mmscope.analyze.table import nest


def reference(thread, sub, start, end):
    n = len(start)
    depth, parent = [0] * n, [-1] * n

    def contains(p, c):
        return end[p] > start[p] and start[p] <= start[c] < end[p] and end[c] <= end[p]

    stack, group = [], None
    for i in sorted(range(n), key=lambda i: (thread[i], sub[i], start[i], -end[i], i)):
        if (thread[i], sub[i]) != group:
            stack, group = [], (thread[i], sub[i])
        while stack and not contains(stack[-1], i):
            stack.pop()
        parent[i] = stack[-1] if stack else -1
        depth[i] = len(stack)
        if end[i] > start[i]:
            stack.append(i)
    return depth, parent


# One thread's history: push, pop, a zero-length range, or the clock moving on (maybe by 0,
# which gives equal ranges, ranges touching end to start and zero-length ones on boundaries).
OPS = st.lists(st.tuples(st.sampled_from("push pop zero tick".split()), st.integers(0, 3)),
               max_size=40)


def simulate(ops, thread: int, sub: int, rows: list) -> None:
    clock, stack = 0, []
    for op, k in ops:
        if op == "push":
            rows.append([thread, sub, clock, None])
            stack.append(len(rows) - 1)
        elif op == "pop" and stack:
            rows[stack.pop()][3] = clock
        elif op == "zero":
            rows.append([thread, sub, clock, clock])
        else:
            clock += k
    while stack:
        rows[stack.pop()][3] = clock


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1), OPS), min_size=1, max_size=4),
       st.randoms(use_true_random=False))
def test_nesting_matches_the_stack_walk(histories, rnd):
    rows: list = []
    seen = set()
    for thread, sub, ops in histories:
        if (thread, sub) in seen:  # one history per stack
            continue
        seen.add((thread, sub))
        simulate(ops, (1 << 48) | (thread << 24) | thread, sub, rows)
    rnd.shuffle(rows)
    cols = [np.array([r[k] for r in rows], dtype=np.int64) for k in range(4)]
    depth, parent = nest(*cols)
    ref_depth, ref_parent = reference(*(c.tolist() for c in cols))
    assert depth.tolist() == ref_depth
    assert parent.tolist() == ref_parent
