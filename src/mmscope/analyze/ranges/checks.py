"""The structural checks of docs/design.md §6 on a RangeTable; each gives {"name", "ok", "detail"}.

A failing check's detail names how many ranges break it and the first one, with thread and time.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from mmscope import stages
from mmscope.analyze.ranges.table import (RangeTable, enclosing, group_index, packed_keys,
                                          packed_order)

SIBLINGS = stages.PREPROCESS_SIBLINGS


def run_all(frame, pairs) -> list[dict]:
    table = frame.table
    return [ranges_nest(table), vit_excludes_save(table), siblings_disjoint(table),
            siblings_inside_preprocess(table), step_meta_joined(frame, pairs)]


def _result(name: str, bad: int, total: int, first: str, what: str) -> dict:
    if total == 0:
        return {"name": name, "ok": True, "detail": f"no {what} in the profile"}
    if bad == 0:
        return {"name": name, "ok": True, "detail": f"all {total} {what} pass"}
    return {"name": name, "ok": False, "detail": f"{bad} of {total} {what} fail; first: {first}"}


def where(table: RangeTable, row: int) -> str:
    """A range as a person finds it in a timeline: name, times, process and thread."""
    t = int(table.thread_of(row))
    thread = table.thread_names.get(t)
    label = f"pid {(t >> 24) & 0xFFFFFF} tid {t & 0xFFFFFF}" + (f" ({thread})" if thread else "")
    return (f"'{table.name_of(row)}' [{int(table.start[row])}, {int(table.end[row])}] ns "
            f"on {label}")


def _inside(table: RangeTable, outer: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """For each inner row, the outer row that contains it (its nearest such ancestor), or -1."""
    return enclosing(table, outer, inner)


def vit_excludes_save(table: RangeTable) -> dict:
    name = f"{stages.VIT_FORWARD} never contains {stages.EC_SAVE}"
    saves = table.rows_named(stages.EC_SAVE)
    host = _inside(table, table.rows_named(stages.VIT_FORWARD), saves)
    bad = np.flatnonzero(host >= 0)
    first = ""
    if len(bad):
        i = bad[np.argmin(table.start[saves[bad]])]
        first = f"{where(table, saves[i])} inside {where(table, host[i])}"
    return _result(name, len(bad), len(saves), first, f"'{stages.EC_SAVE}' ranges")


def siblings_disjoint(table: RangeTable) -> dict:
    """No two of the preprocess children overlap on a thread (touching ends are fine): taken by
    (thread, start, row), none starts before the latest end so far on its thread."""
    name = "preprocess children are disjoint siblings"
    rows = table.rows_named(*SIBLINGS)
    if len(rows) < 2:
        return _result(name, 0, len(rows), "", "preprocess child ranges")
    found = np.zeros(3, np.int64)
    if _overlaps_in_row_order(rows, table.group, table.n_subs, table.start, table.end,
                              len(table.threads), found):
        bad, at, holder = found.tolist()
        first = f"{where(table, at)} overlaps {where(table, holder)}" if bad else ""
        return _result(name, bad, len(rows), first, "preprocess child ranges")
    g = group_index(table.thread_of(rows))
    ks, ke = packed_keys(g, table.start[rows], table.end[rows])
    order, ks = packed_order(g, ks)  # rows are in row order: ties stay by row
    del g
    ke = ke[order]
    # Packed keys keep each thread's ends below the next thread's starts.
    latest = np.maximum.accumulate(ke)
    bad = np.flatnonzero(ks[1:] < latest[:-1]) + 1
    first = ""
    if len(bad):
        at = bad[np.argmin(table.start[rows[order[bad]]])]
        holder = np.maximum.accumulate(np.where(ke == latest, np.arange(len(ke)), 0))
        first = (f"{where(table, rows[order[at]])} overlaps "
                 f"{where(table, rows[order[holder[at - 1]]])}")
    return _result(name, len(bad), len(rows), first, "preprocess child ranges")


@njit(cache=True, nogil=True)
def _overlaps_in_row_order(rows, group, n_subs, start, end, n_threads, found):
    """siblings_disjoint in one pass where each thread's rows come in start order: found =
    (how many start before the latest end so far on their thread, the first of them by start,
    the row holding that end). False where a thread's starts go back (the rows need a sort)."""
    latest = np.full(n_threads, np.iinfo(np.int64).min, np.int64)
    holder = np.full(n_threads, -1, np.int64)
    last_start = np.full(n_threads, np.iinfo(np.int64).min, np.int64)
    bad, first, first_holder = 0, -1, -1
    for r in rows:
        t = group[r] // n_subs  # the thread's index
        s, e = start[r], end[r]
        if s < last_start[t]:
            return False
        last_start[t] = s
        if s < latest[t]:
            bad += 1
            if first < 0 or s < start[first]:
                first, first_holder = r, holder[t]
        if e >= latest[t]:
            latest[t], holder[t] = e, r
    found[0], found[1], found[2] = bad, first, first_holder
    return True


def ranges_nest(table: RangeTable) -> dict:
    """Ranges on a thread either contain one another or do not overlap; one that starts inside
    another and ends after it is kept beside it, not inside (counted here). Within the format's
    time resolution (table.slack_ns) a range ending after its parent is its child still."""
    name = "ranges nest (none overlaps another partly)"
    crossing = table.crossing
    first = ""
    if len(crossing):
        row = int(crossing[np.argmin(table.start[crossing])])
        first = f"{where(table, row)} ends after a range it starts inside"
    positive = int(np.count_nonzero(table.end > table.start))
    result = _result(name, len(crossing), positive, first, "ranges of positive length")
    if table.slack_ns:
        result["detail"] += (f" (ends up to {table.slack_ns} ns apart taken as one: the "
                             "trace's time resolution)")
    return result


def siblings_inside_preprocess(table: RangeTable) -> dict:
    name = f"preprocess children lie inside {stages.PREPROCESS}"
    pre = table.rows_named(stages.PREPROCESS)
    rows = table.rows_named(*SIBLINGS)
    if len(pre) == 0:
        return {"name": name, "ok": True,
                "detail": f"skipped: no '{stages.PREPROCESS}' ranges in the profile"}
    host = _inside(table, pre, rows)
    bad = np.flatnonzero(host < 0)
    first = ""
    if len(bad):
        first = where(table, rows[bad[np.argmin(table.start[rows[bad]])]])
    return _result(name, len(bad), len(rows), first, "preprocess child ranges")


def step_meta_joined(frame, pairs) -> dict:
    """Every step_meta is the nearest preceding step_meta of some forward on its thread; the
    last step of a thread whose forward the trace does not hold (it ends inside that step) is
    no failure, and is counted apart."""
    from mmscope.analyze.ranges.steps import cut_metas, step_meta_rows

    table = frame.table
    name = f"every step_meta joins a '{stages.FORWARD}' on its thread"
    metas = step_meta_rows(table)[0]
    unjoined = metas[~pairs.metas_joined]
    cut = cut_metas(frame, unjoined)
    bad = np.setdiff1d(unjoined, cut)
    first = where(table, bad[np.argmin(table.start[bad])]) if len(bad) else ""
    result = _result(name, len(bad), len(metas), first, "step_meta ranges")
    if len(cut):
        result["detail"] += (f"; {len(cut)} ends its thread's trace before its forward (the "
                             "trace was cut inside that step)")
    return result
