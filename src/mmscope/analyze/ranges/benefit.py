"""The encoder cache's benefit, like for like: among steps of one kind (prefill, mixed, ...), the
preprocess time of the steps that ran the encoder against the steps that did not.

A step is a preprocess range that a forward follows on its thread (steps.steps_of); its kind is
its step_meta shape. Every figure carries the number of steps behind it.
"""
from __future__ import annotations

import numpy as np

from mmscope import stages
from mmscope.analyze.ranges.steps import KINDS

# The kind whose comparison is the headline: the first with steps on both sides. Decode steps
# schedule no prompt tokens, so the encoder runs in steps that prefill.
HEADLINE_ORDER = ("prefill", "mixed", "unknown", "idle", "decode")

BY_KIND = """
SELECT kind, encoder_ns > 0 AS ran, count(*), CAST(sum(pre_ns) AS BIGINT),
       quantile_disc(pre_ns, 0.5), max(pre_ns), CAST(sum(encoder_ns) AS BIGINT)
FROM steps WHERE forward >= 0 GROUP BY kind, ran ORDER BY kind, ran
"""
ENCODER = """
SELECT count(*), CAST(sum(encoder_ns) AS BIGINT), quantile_disc(encoder_ns, 0.5),
       max(encoder_ns), CAST(sum(pre_ns) AS BIGINT)
FROM steps WHERE forward >= 0 AND encoder_ns > 0
"""


def _figures(steps: int, total: int, p50: int, high: int) -> dict:
    return {"steps": steps, "total_ns": total, "mean_ns": (total + steps // 2) // steps,
            "p50_ns": int(p50), "max_ns": int(high)}


def _none() -> dict:
    return {"steps": 0, "total_ns": 0, "mean_ns": None, "p50_ns": None, "max_ns": None}


def cache_benefit(frame, step_table) -> dict:
    table = frame.table
    n_pre, n_vit = len(step_table), len(table.rows_named(stages.VIT_FORWARD))
    if n_pre == 0:
        return {"available": False, "reason": f"no '{stages.PREPROCESS}' ranges in the profile"}
    if n_vit == 0:
        return {"available": False,
                "reason": f"the profile has no '{stages.VIT_FORWARD}' (encoder) ranges, so "
                          f"which of its {n_pre} preprocess steps ran the encoder is unknown"}
    stepped = step_table["forward"] >= 0
    if not stepped.any():
        return {"available": False,
                "reason": f"no '{stages.FORWARD}' follows any of the {n_pre} preprocess ranges "
                          "on its thread: no step to compare"}
    frame.sql.register("steps", {k: step_table[k] for k in ("kind", "forward", "pre_ns",
                                                            "encoder_ns")})
    by_kind, encoder, ran_pre = _by_kind(frame.sql)
    out = {"available": True, "preprocess_ranges": n_pre, "steps": int(stepped.sum()),
           "without_forward": _left_out(step_table["pre_ns"][~stepped]),
           "encoder_steps": encoder["steps"],
           "encoder_step_fraction": round(encoder["steps"] / int(stepped.sum()), 6),
           "encoder": encoder,
           "encoder_share_of_preprocess": (round(encoder["total_ns"] / ran_pre, 6)
                                           if ran_pre else None),
           "by_kind": by_kind}
    return {**out, **_headline(by_kind)}


def _by_kind(sql) -> tuple[list[dict], dict, int]:
    """Per kind, both sides; the encoder's own figures over every step that ran it, and the
    preprocess time of those steps."""
    sides: dict[int, dict] = {}
    for kind, ran, n, pre_total, pre_p50, pre_max, enc_total in sql.rows(BY_KIND):
        side = sides.setdefault(kind, {"with_encoder": _none(), "without_encoder": _none()})
        figures = _figures(n, pre_total, pre_p50, pre_max)
        if ran:  # how much of that preprocess the encoder itself took
            figures["encoder_mean_ns"] = (enc_total + n // 2) // n
        side["with_encoder" if ran else "without_encoder"] = figures
    rows = []
    for kind, side in sides.items():
        w, wo = side["with_encoder"]["mean_ns"], side["without_encoder"]["mean_ns"]
        rows.append({"kind": KINDS[kind], **side,
                     "difference_ns": None if w is None or wo is None else w - wo})
    n, total, p50, high, ran_pre = sql.rows(ENCODER)[0]
    return rows, (_figures(n, total, p50, high) if n else _none()), ran_pre or 0


def _left_out(pre_ns: np.ndarray) -> dict:
    """The preprocess ranges no forward follows: no step, left out of the comparison."""
    n = len(pre_ns)
    return {"ranges": n, "mean_ns": int(round(float(pre_ns.mean()))) if n else None}


def _headline(by_kind: list[dict]) -> dict:
    found = {r["kind"]: r for r in by_kind}
    for kind in HEADLINE_ORDER:
        row = found.get(kind)
        if row and row["difference_ns"] is not None:
            return {"compared_kind": kind, "preprocess_saved_ns": row["difference_ns"],
                    "comparison_reason": None}
    return {"compared_kind": None, "preprocess_saved_ns": None,
            "comparison_reason": "no kind of step has steps both with and without encoder work"}
