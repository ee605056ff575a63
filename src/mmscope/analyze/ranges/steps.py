"""The steps of a profile: each forward joined (as of its start) to the nearest preceding step_meta
on its thread (the step's batch shape) and to the preprocess it follows (the step's preprocess).

It gives forward time against batch shape, and the per-step table the cache benefit and the
report's per-step view read.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from mmscope import stages
from mmscope.analyze.ranges.figures import nearest_rank
from mmscope.analyze.ranges.nesting import position_type
from mmscope.analyze.ranges.table import RangeTable, asof, enclosing

SHAPE_FIELDS = ("prefill", "decode", "total", "reqs")


def step_meta_shapes(table: RangeTable) -> tuple[np.ndarray, np.ndarray]:
    """The (prefill, decode, total, reqs) per name id (-1s: no step_meta), and the ids of the
    parseable step_meta names."""
    if "step_meta_shapes" not in table._cache:
        shapes = np.full((len(table.names), 4), -1, dtype=np.int64)
        names = table.names_column()
        at = names.str.starts_with(stages.STEP_META_PREFIX).arg_true()
        if len(at):
            shapes[at.to_numpy()] = _parse_shapes(names.gather(at))
        if shapes.max(initial=-1) <= np.iinfo(np.int32).max:
            shapes = shapes.astype(np.int32)  # the steps' shapes in half the memory
        table._cache["step_meta_shapes"] = (shapes, np.flatnonzero(shapes[:, 0] >= 0))
    return table._cache["step_meta_shapes"]


STEP_META_ROWS = ("ids", "step_meta")  # RangeTable.find_rows' key of the step_meta rows


def step_meta_rows(table: RangeTable) -> tuple[np.ndarray, np.ndarray]:
    """Rows of parseable step_meta ranges, and the (prefill, decode, total, reqs) per name id."""
    shapes, ids = step_meta_shapes(table)
    if STEP_META_ROWS not in table._cache:
        table._cache[STEP_META_ROWS] = table.rows_with_ids(ids)
    return table._cache[STEP_META_ROWS], shapes


def _parse_shapes(names) -> np.ndarray:
    """(prefill, decode, total, reqs) of each name, -1s where it is no step_meta.

    Every profile step has its own step_meta name (hundreds of thousands in a long run): they are
    matched with `stages.parse_step_meta`'s pattern in one vectorized call (`names`: a polars
    column); a name that matches but whose numbers do not read as int64 (other digits, too long)
    goes through it by itself."""
    import polars as pl

    found = names.str.extract_groups(stages.STEP_META_PATTERN)
    matched = found.struct.field("1").is_not_null().to_numpy()
    out = np.full((len(names), 4), -1, dtype=np.int64)
    fields = [found.struct.field(str(k + 1)).cast(pl.Int64, strict=False) for k in range(4)]
    values = np.stack([f.fill_null(-1).to_numpy() for f in fields], axis=1)
    out[matched] = values[matched]
    for j in np.flatnonzero(matched & (values < 0).any(axis=1)).tolist():
        out[j] = _shape_of(names[j])
    return out


def _shape_of(name: str) -> tuple[int, int, int, int]:
    shape = stages.parse_step_meta(name)
    return (-1, -1, -1, -1) if shape is None else (shape.prefill, shape.decode, shape.total,
                                                    shape.reqs)


KINDS = ("prefill", "decode", "mixed", "idle", "unknown")  # unknown: no step_meta joined


class Columns:
    """Numpy columns of equal length: `len()` is the number of rows and `cols[name]` a column,
    as of a DataFrame."""

    def __init__(self, columns: dict[str, np.ndarray]):
        self.columns = columns

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]


class StepPairs(Columns):
    """The step join: one row per joined forward. `forwards`: every forward row in time order
    (start, then row); `meta_at`: per forward there, its step_meta's position among the
    step_meta rows (-1: none); `metas_joined`: per step_meta row, whether a forward joined it."""

    COLUMNS = ("forward_row", "meta_row", "thread", "start", "forward_ns") + SHAPE_FIELDS

    def __init__(self, columns: dict, forwards: np.ndarray, meta_at: np.ndarray,
                 metas_joined: np.ndarray):
        super().__init__(columns)
        self.forwards, self.meta_at, self.metas_joined = forwards, meta_at, metas_joined


def step_join(frame) -> StepPairs:
    """One row per forward that found a step_meta, in time order (start, then row): the
    nearest step_meta starting at or before it on its thread; of step_meta ranges that start
    together on a thread, the last in row order is the step's."""
    table = frame.table
    metas, shapes = step_meta_rows(table)  # in row order
    forwards = _in_time_order(table, table.rows_named(stages.FORWARD))
    at = asof(table, forwards, metas)
    joined = at >= 0
    fwd, meta = forwards[joined], metas[at[joined]]  # row positions, in 32 bits where they fit
    metas_joined = np.zeros(len(metas), bool)
    metas_joined[at[joined]] = True
    start = table.start[fwd]
    ids = table.name_id[meta]
    return StepPairs({"forward_row": fwd, "meta_row": meta, "thread": table.thread_of(fwd),
                      "start": start, "forward_ns": table.end[fwd] - start,
                      **{k: shapes[ids, j] for j, k in enumerate(SHAPE_FIELDS)}},
                     forwards, at, metas_joined)


def _in_time_order(table: RangeTable, rows: np.ndarray) -> np.ndarray:
    """Rows (in row order) by start, ties by row."""
    return rows[np.argsort(table.start[rows], kind="stable")]


@njit(cache=True, nogil=True)
def _firsts(at, out):
    """out[p]: the first k with at[k] == p (-1: none)."""
    out[:] = -1
    for k in range(len(at)):
        p = at[k]
        if p >= 0 and out[p] < 0:
            out[p] = k


class Steps(Columns):
    """One row per preprocess range, in time order: `pre` its row, `forward` the row of the
    forward that follows it (-1: none, no step), `meta` that forward's step_meta row (-1), the
    shape and kind, and its times: `pre_ns`, `encoder_ns` (vit_forward inside it), `forward_ns`."""


def steps_of(frame, pairs: StepPairs) -> Steps:
    table = frame.table
    pre = _in_time_order(table, table.rows_named(stages.PREPROCESS))
    # Per preprocess, the first forward (by start, then row) of those whose nearest preceding
    # preprocess on their thread it is, and that forward's step_meta.
    first = np.empty(len(pre), np.int64)
    _firsts(asof(table, pairs.forwards, pre), first)
    stepped = first >= 0
    forward = np.full(len(pre), -1, position_type(len(table)))
    forward[stepped] = pairs.forwards[first[stepped]]
    meta_at = np.where(stepped, pairs.meta_at[np.maximum(first, 0)], -1)
    del first
    metas, shapes_of = step_meta_rows(table)
    meta = np.full(len(pre), -1, position_type(len(table)))
    meta[meta_at >= 0] = metas[meta_at[meta_at >= 0]]
    shapes = shapes_of[table.name_id[np.maximum(meta, 0)]]
    shapes[meta < 0] = -1
    cols = {"pre": pre, "forward": forward, "meta": meta, "thread": table.thread_of(pre),
            "start": table.start[pre], "pre_ns": table.end[pre] - table.start[pre],
            "encoder_ns": _encoder_time(table, pre),
            "forward_ns": np.where(forward >= 0, table.end[forward] - table.start[forward], 0),
            **{k: shapes[:, j] for j, k in enumerate(SHAPE_FIELDS)}}
    cols["kind"] = kind_codes(cols["prefill"], cols["decode"])
    return Steps(cols)


def _encoder_time(table: RangeTable, pre: np.ndarray) -> np.ndarray:
    """Per preprocess row, the vit_forward time inside it."""
    vit = table.rows_named(stages.VIT_FORWARD)
    host = enclosing(table, pre, vit)
    inside = host >= 0
    by_row = np.argsort(pre)
    at = by_row[np.searchsorted(pre, host[inside], sorter=by_row)]
    return np.bincount(at, weights=table.end[vit[inside]] - table.start[vit[inside]],
                       minlength=len(pre)).astype(np.int64)


def kind_codes(prefill: np.ndarray, decode: np.ndarray) -> np.ndarray:
    """Index into KINDS per step: prefill, decode, mixed, idle; unknown without a shape."""
    code = np.empty(len(prefill), np.int8)
    _kind_codes(prefill, decode, code)
    return code


PREFILL, DECODE, MIXED, IDLE, UNKNOWN = (KINDS.index(k) for k in KINDS)


@njit(cache=True, nogil=True)
def _kind_codes(prefill, decode, code):
    for i in range(len(prefill)):
        p, d = prefill[i], decode[i]
        if p < 0:
            code[i] = UNKNOWN
        elif p > 0 and d > 0:
            code[i] = MIXED
        elif p > 0 and d == 0:
            code[i] = PREFILL
        elif p == 0 and d > 0:
            code[i] = DECODE
        else:
            code[i] = IDLE


def by_kind(kinds: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(kind, its positions) of each kind present, in KINDS' order."""
    order = np.argsort(kinds, kind="stable")
    bounds = np.searchsorted(kinds[order], np.arange(len(KINDS) + 1))
    return [(k, order[bounds[k]:bounds[k + 1]]) for k in range(len(KINDS))
            if bounds[k + 1] > bounds[k]]


def cut_metas(frame, metas: np.ndarray) -> np.ndarray:
    """Of these step_meta rows, those the trace ends inside of: the last step_meta of its
    thread, with no forward of that thread starting at or after it (the process was stopped
    before its forward ended, or the profile's window closed)."""
    if len(metas) == 0:
        return metas
    table = frame.table
    last_meta = _latest_start(table, step_meta_rows(table)[0])
    last_forward = _latest_start(table, table.rows_named(stages.FORWARD))
    cut = [m for m, thread, start in zip(metas.tolist(), table.thread_of(metas).tolist(),
                                         table.start[metas].tolist())
           if start == last_meta[thread] and last_forward.get(thread, -1) < start]
    return np.array(cut, np.int64)


def _latest_start(table: RangeTable, rows: np.ndarray) -> dict[int, int]:
    """{thread: the latest start of these rows on it}."""
    threads, inverse = np.unique(table.thread_of(rows), return_inverse=True)
    latest = np.full(len(threads), np.iinfo(np.int64).min)
    np.maximum.at(latest, inverse, table.start[rows])
    return dict(zip(threads.tolist(), latest.tolist()))


def summary(frame, pairs: StepPairs) -> dict:
    """Counts, unmatched ranges, forward time per step kind and a linear fit against tokens."""
    table = frame.table
    forwards = len(table.rows_named(stages.FORWARD))
    metas = len(step_meta_rows(table)[0])
    joined = int(np.count_nonzero(pairs.metas_joined))
    fit, fit_reason = _fit(pairs)
    return {"pairs": len(pairs), "forwards": forwards, "step_metas": metas,
            "unmatched_forwards": forwards - len(pairs), "unjoined_step_metas": metas - joined,
            "by_kind": _by_kind(pairs), "fit": fit, "fit_reason": fit_reason,
            "available": len(pairs) > 0, "reason": _missing(forwards, metas, len(pairs))}


def _missing(forwards: int, metas: int, pairs: int) -> str | None:
    """Why the step join has nothing to show (None: it has)."""
    if pairs:
        return None
    if forwards == 0 and metas == 0:
        return (f"the profile has no '{stages.FORWARD}' and no step_meta ranges: forward time "
                "against batch shape is unknown")
    if forwards == 0:
        return f"the profile has no '{stages.FORWARD}' ranges ({metas} step_meta)"
    if metas == 0:
        return (f"the profile has no step_meta ranges ({forwards} forwards): their batch "
                "shapes are unknown")
    return (f"no '{stages.FORWARD}' follows a step_meta on its thread ({forwards} forwards, "
            f"{metas} step_meta)")


def _by_kind(pairs: StepPairs) -> list[dict]:
    if len(pairs) == 0:
        return []
    out = []
    for kind, at in by_kind(kind_codes(pairs["prefill"], pairs["decode"])):
        forward, tokens = pairs["forward_ns"][at], pairs["total"][at]
        n = len(forward)
        out.append({"kind": KINDS[kind], "steps": n,
                    "forward_mean_ns": int(round(int(forward.sum()) / n)),
                    "forward_p50_ns": nearest_rank(forward, 0.5),
                    "tokens_mean": round(int(tokens.sum()) / n, 3)})
    return out


def _fit(pairs) -> tuple[dict | None, str | None]:
    """Least squares forward_ns = intercept + slope * total tokens, or None and why not."""
    if len(pairs) < 2:
        return None, f"{len(pairs)} joined step(s); a fit needs two or more"
    x = pairs["total"].astype(np.float64)
    y = pairs["forward_ns"].astype(np.float64)
    if np.ptp(x) == 0:
        return None, f"every joined step has {int(x[0])} tokens; a fit needs two batch sizes"
    slope, intercept = np.polyfit(x, y, 1)
    resid = y - (intercept + slope * x)
    r2 = 1.0 - float(resid @ resid) / float(((y - y.mean()) ** 2).sum()) if np.ptp(y) else 1.0
    return {"ns_per_token": round(float(slope), 3), "intercept_ns": round(float(intercept), 1),
            "r2": round(r2, 4), "steps": len(pairs)}, None
