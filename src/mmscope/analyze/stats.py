"""Per-stage statistics of a RangeTable: count, total, mean, percentiles, max, share of parent.

Percentiles are nearest-rank (always a measured duration): p-th of n sorted = item ceil(p*n/100).
"""
from __future__ import annotations

import re

import numpy as np

from mmscope import stages
from mmscope.analyze.table import RangeTable

# Every step_meta range has its own name (it carries the step's shape): one stage for them all.
STEP_META_STAGE = stages.STEP_META_PREFIX.rstrip(": ")
PERCENTILES = (50, 90, 99)


def stage_names(names: list[str]) -> tuple[list[str], np.ndarray]:
    """Stage list and the map name id -> stage id (step_meta names fold into one stage)."""
    index: dict[str, int] = {}
    prefix = stages.STEP_META_PREFIX
    # One list, then one array: a numpy item assignment per name costs more than the lookup.
    codes = [index.setdefault(STEP_META_STAGE if name.startswith(prefix) else name, len(index))
             for name in names]
    return list(index), np.array(codes, dtype=np.int32).reshape(len(names))


def stage_stats(table: RangeTable, name_filter: str | None = None) -> list[dict]:
    """One dict per stage, largest total first; durations are integer nanoseconds."""
    names, mapping = stage_names(table.names)
    if len(table) == 0:
        return []
    sid = mapping[table.name_id]
    dur = table.duration
    base = _aggregates(sid, dur, len(names))
    pct = _percentiles(sid, dur, base["count"])
    parent_name, share = _share_of_parent(table, sid, dur, names)
    pattern = re.compile(name_filter) if name_filter else None
    out = []
    for s, name in enumerate(names):
        n = int(base["count"][s])
        if n == 0 or (pattern and not pattern.search(name)):
            continue
        total = int(base["total"][s])
        row = {"name": name, "count": n, "total_ns": total, "mean_ns": (total + n // 2) // n}
        row.update({f"p{p}_ns": int(pct[p][s]) for p in PERCENTILES})
        row.update(min_ns=int(base["min"][s]), max_ns=int(base["max"][s]),
                   parent=parent_name[s], share_of_parent=share[s])
        out.append(row)
    out.sort(key=lambda r: (-r["total_ns"], r["name"]))
    return out


def _aggregates(sid: np.ndarray, dur: np.ndarray, n_stages: int) -> dict[str, np.ndarray]:
    """Exact integer count/total/min/max per stage (polars sums int64 without float rounding)."""
    import polars as pl

    df = pl.DataFrame({"s": sid, "d": dur})
    agg = df.group_by("s").agg(pl.len().alias("count"), pl.col("d").sum().alias("total"),
                               pl.col("d").min().alias("min"), pl.col("d").max().alias("max"))
    out = {k: np.zeros(n_stages, np.int64) for k in ("count", "total", "min", "max")}
    at = agg["s"].to_numpy()
    for k in out:
        out[k][at] = agg[k].to_numpy()
    return out


def _percentiles(sid: np.ndarray, dur: np.ndarray, count: np.ndarray) -> dict[int, np.ndarray]:
    """Nearest-rank percentiles from one sort of (stage, duration) packed into an int64."""
    ordered = _sorted_by_stage(sid, dur)
    offsets = np.concatenate([[0], np.cumsum(count)[:-1]])
    out = {}
    for p in PERCENTILES:
        rank = np.maximum((p * count + 99) // 100, 1)  # ceil(p*n/100), integer exact
        idx = np.minimum(offsets + rank - 1, len(ordered) - 1)
        out[p] = np.where(count > 0, ordered[idx], 0)
    return out


def _sorted_by_stage(sid: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Durations ordered by (stage, duration)."""
    bits = max(int(dur.max()), 1).bit_length()
    if int(dur.min()) >= 0 and int(sid.max()).bit_length() + bits <= 62:
        key = sid.astype(np.int64) << bits
        key |= dur
        key.sort()  # values, not rows: any sort gives the same array; the low bits are durations
        key &= (1 << bits) - 1
        return key
    return dur[np.lexsort((dur, sid))]


def _child_time(table: RangeTable, s_child, p_child, d_child, dur):
    """Per stage, the time of its ranges inside their parents. Children of one parent never
    overlap unless some range crosses another (table.crossing); then a stage's time inside one
    parent counts at most that parent's length, so that no share exceeds the whole."""
    import polars as pl

    df = pl.DataFrame({"s": s_child, "p": p_child, "d": d_child})
    if len(table.crossing):
        df = df.group_by("s", "p").agg(pl.col("d").sum())
        per_pair = df.with_columns(cap=pl.Series(dur[df["p"].to_numpy()]))
        df = per_pair.with_columns(d=pl.min_horizontal("d", "cap")).select("s", "d")
    return df.group_by("s").agg(pl.col("d").sum())


def _share_of_parent(table: RangeTable, sid: np.ndarray, dur: np.ndarray, names: list[str]):
    """Per stage: the usual parent stage and the stage's time over its parents' (each once)."""
    import polars as pl

    n = len(names)
    parent_name: list[str | None] = [None] * n
    share: list[float | None] = [None] * n
    has = np.flatnonzero(table.parent >= 0)
    if len(has) == 0:
        return parent_name, share
    s_child, p_child = sid[has], table.parent[has]
    child = _child_time(table, s_child, p_child, dur[has], dur)
    del has
    if len(table) * n < (1 << 62):
        # The distinct (stage, parent row) pairs, as one int64 key (parent * stages + stage).
        key = pl.Series(p_child * n + s_child).unique().to_numpy()
        pairs = pl.DataFrame({"s": (key % n).astype(sid.dtype), "p": key // n})
        del key
    else:
        pairs = pl.DataFrame({"s": s_child, "p": p_child}).unique()
    del s_child, p_child
    p_rows = pairs["p"].to_numpy()
    pairs = pairs.with_columns(pd=pl.Series(dur[p_rows]), ps=pl.Series(sid[p_rows]))
    parent_total = pairs.group_by("s").agg(pl.col("pd").sum())
    usual = (pairs.group_by("s", "ps").agg(pl.len().alias("k"))
             .sort(["s", "k", "ps"], descending=[False, True, False]).unique("s", keep="first"))
    totals = dict(zip(parent_total["s"].to_list(), parent_total["pd"].to_list()))
    for s, d in zip(child["s"].to_list(), child["d"].to_list()):
        share[s] = round(d / totals[s], 6) if totals.get(s) else None
    for s, ps in zip(usual["s"].to_list(), usual["ps"].to_list()):
        parent_name[s] = names[ps]
    return parent_name, share
