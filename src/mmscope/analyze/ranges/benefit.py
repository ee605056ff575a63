"""The encoder cache's benefit, like for like: among steps of one kind (prefill, mixed, ...), the
preprocess time of the steps that ran the encoder against the steps that did not.

A step is a preprocess range that a forward follows on its thread (steps.steps_of); its kind is
its step_meta shape. Every figure carries the number of steps behind it.
"""
from __future__ import annotations

import numpy as np

from mmscope import stages
from mmscope.analyze.ranges.figures import nearest_rank
from mmscope.analyze.ranges.steps import KINDS, by_kind

# The kind whose comparison is the headline: the first with steps on both sides. Decode steps
# schedule no prompt tokens, so the encoder runs in steps that prefill.
HEADLINE_ORDER = ("prefill", "mixed", "unknown", "idle", "decode")

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
    by_kind, encoder, ran_pre = _by_kind({k: step_table[k][stepped]
                                          for k in ("kind", "pre_ns", "encoder_ns")})
    out = {"available": True, "preprocess_ranges": n_pre, "steps": int(stepped.sum()),
           "without_forward": _left_out(step_table["pre_ns"][~stepped]),
           "encoder_steps": encoder["steps"],
           "encoder_step_fraction": round(encoder["steps"] / int(stepped.sum()), 6),
           "encoder": encoder,
           "encoder_share_of_preprocess": (round(encoder["total_ns"] / ran_pre, 6)
                                           if ran_pre else None),
           "by_kind": by_kind}
    return {**out, **_headline(by_kind)}


def _by_kind(steps: dict[str, np.ndarray]) -> tuple[list[dict], dict, int]:
    """Per kind, both sides; the encoder's own figures over every step that ran it, and the
    preprocess time of those steps. `steps`: the steps a forward follows."""
    sides: dict[int, dict] = {}
    ran_encoder = steps["encoder_ns"] > 0
    for kind, of_kind in by_kind(steps["kind"]):
        for ran in (False, True):
            at = of_kind[ran_encoder[of_kind] == ran]
            if not len(at):
                continue
            pre = steps["pre_ns"][at]
            side = sides.setdefault(kind, {"with_encoder": _none(), "without_encoder": _none()})
            figures = _figures(len(pre), int(pre.sum()), nearest_rank(pre, 0.5), int(pre.max()))
            if ran:  # how much of that preprocess the encoder itself took
                n = len(pre)
                figures["encoder_mean_ns"] = (int(steps["encoder_ns"][at].sum()) + n // 2) // n
            side["with_encoder" if ran else "without_encoder"] = figures
    rows = []
    for kind, side in sides.items():
        w, wo = side["with_encoder"]["mean_ns"], side["without_encoder"]["mean_ns"]
        rows.append({"kind": KINDS[kind], **side,
                     "difference_ns": None if w is None or wo is None else w - wo})
    encoder = steps["encoder_ns"][ran_encoder]
    if not len(encoder):
        return rows, _none(), 0
    return rows, _figures(len(encoder), int(encoder.sum()), nearest_rank(encoder, 0.5),
                          int(encoder.max())), int(steps["pre_ns"][ran_encoder].sum())


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
