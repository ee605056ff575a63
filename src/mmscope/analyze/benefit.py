"""The encoder-cache benefit: preprocess time of steps that ran the encoder against the others.

A step is one `preprocess` range; it ran the encoder when a `vit_forward` lies inside it.
"""
from __future__ import annotations

import numpy as np

from mmscope import stages
from mmscope.analyze.checks import _inside
from mmscope.analyze.table import RangeTable


def _summary(values: np.ndarray) -> dict:
    n = len(values)
    if n == 0:
        return {"steps": 0, "total_ns": 0, "mean_ns": None, "p50_ns": None, "max_ns": None}
    rank = (50 * n + 99) // 100 - 1
    total = int(values.sum())
    return {"steps": n, "total_ns": total, "mean_ns": (total + n // 2) // n,
            "p50_ns": int(np.partition(values, rank)[rank]), "max_ns": int(values.max())}


def encoder_per_step(table: RangeTable) -> tuple[np.ndarray, np.ndarray]:
    """Preprocess rows in time order and the vit_forward time inside each (0: no encoder run);
    kept with the table (the cache benefit and the report's plot both need it)."""
    if "encoder_per_step" not in table._cache:
        table._cache["encoder_per_step"] = _encoder_per_step(table)
    return table._cache["encoder_per_step"]


def _encoder_per_step(table: RangeTable) -> tuple[np.ndarray, np.ndarray]:
    pre = table.rows_named(stages.PREPROCESS)
    begin = table.start[pre]
    if len(pre) > 1 and (begin[1:] < begin[:-1]).any():  # exports list rows in time order
        pre = pre[np.argsort(begin, kind="stable")]
    vit = table.rows_named(stages.VIT_FORWARD)
    host = _inside(table, pre, vit)
    enc = np.zeros(len(pre), dtype=np.int64)
    inside = host >= 0
    if inside.any():
        if len(pre) < 2 or (pre[1:] > pre[:-1]).all():  # still in row order
            slot = np.searchsorted(pre, host[inside])
        else:
            by_row = np.argsort(pre)
            slot = by_row[np.searchsorted(pre, host[inside], sorter=by_row)]
        v = vit[inside]
        dur = table.end[v] - table.start[v]
        if int(np.abs(dur).sum()) < (1 << 53):  # float64 adds these integers exactly
            enc += np.bincount(slot, weights=dur, minlength=len(pre)).astype(np.int64)
        else:
            np.add.at(enc, slot, dur)
    return pre, enc


def cache_benefit(table: RangeTable) -> dict:
    pre, enc = encoder_per_step(table)
    if len(pre) == 0:
        return {"available": False,
                "reason": f"no '{stages.PREPROCESS}' ranges in the profile"}
    if len(table.rows_named(stages.VIT_FORWARD)) == 0:
        return {"available": False,
                "reason": f"the profile has no '{stages.VIT_FORWARD}' (encoder) ranges, so "
                          f"which of its {len(pre)} preprocess steps ran the encoder is unknown"}
    dur = table.end[pre] - table.start[pre]
    ran = enc > 0
    with_enc, without = _summary(dur[ran]), _summary(dur[~ran])
    benefit = None
    if with_enc["mean_ns"] is not None and without["mean_ns"] is not None:
        benefit = with_enc["mean_ns"] - without["mean_ns"]
    share = round(int(enc.sum()) / with_enc["total_ns"], 6) if with_enc["total_ns"] else None
    return {"available": True, "preprocess_steps": len(pre),
            "with_encoder": with_enc, "without_encoder": without,
            "preprocess_saved_per_hit_step_ns": benefit,
            "encoder_per_step": _summary(enc[ran]),
            "encoder_share_of_preprocess": share,
            "encoder_step_fraction": round(float(ran.mean()), 6)}
