"""The analysis of a profile: every computation run once on its range table, into the figures every
output shows (profile, tree, stages, checks, steps, cache benefit, per-step view).

Rendering is apart (terminal.py, html.py); the JSON is `Analysis.to_json()`.
"""
from __future__ import annotations

from dataclasses import dataclass

DOC_KEYS = ("profile", "tree", "stages", "checks", "steps", "cache_benefit", "per_step")


@dataclass
class Analysis:
    """Everything the outputs show; `cache` is the /metrics page's figures, read on every run
    (the rest is what the analysis cache stores)."""

    path: str
    profile: dict
    tree: list[dict]
    stages: list[dict]
    checks: list[dict]
    steps: dict
    cache_benefit: dict
    per_step: dict | None
    cache: dict | None = None

    def to_json(self) -> dict:
        return {**self.doc(), "cache": self.cache}

    def doc(self) -> dict:
        return {k: getattr(self, k) for k in DOC_KEYS}

    @classmethod
    def from_doc(cls, path: str, doc: dict) -> "Analysis":
        """The analysis of a cache entry, under the path the user gave this time."""
        profile = dict(doc["profile"])
        profile["path"] = path
        return cls(path=path, **{**{k: doc[k] for k in DOC_KEYS}, "profile": profile})


def analyze(path: str, table, name_filter: str | None = None,
            raw_names: bool = False) -> Analysis:
    """Every figure of the profile. On the second core: the step join, steps, checks and cache
    benefit (which read the table only), then the device projection; meanwhile here the stage
    tree and its host figures, to which the device time is added."""
    import threading

    from mmscope.analyze.ranges import frame, per_step, stats
    from mmscope.analyze.ranges.beside import Beside

    built = frame.begin(table)
    measured_here = threading.Event()
    beside = Beside(_beside_tree, built, measured_here)
    try:
        frame.complete(built, raw_names)
        measured = stats.measure(built)
    finally:
        measured_here.set()
    step_table, steps_doc, checks_doc, benefit_doc, projected = beside.result()
    if projected is not None:
        frame.project(built, projected)
    by_node, by_stage = measured.said(built.device)
    return Analysis(
        path=path, profile=profile_info(path, built),
        tree=stats.tree(built, by_node, name_filter),
        stages=stats.flat(built, by_node, by_stage, name_filter),
        checks=checks_doc + _malformed_check(table), steps=steps_doc,
        cache_benefit=benefit_doc, per_step=per_step.per_step(built, step_table))


def _beside_tree(built, measured_here):
    """What reads the table only: the step join and what reads it (the step table, the steps'
    summary, the checks, the cache benefit), then the device projection (None: no device
    side), once the host figures are measured: the two passes' columns are never held at once
    (the analysis' peak memory)."""
    from mmscope.analyze.ranges import benefit, checks, device, steps

    pairs = steps.step_join(built)
    step_table = steps.steps_of(built, pairs)
    figures = (step_table, steps.summary(built, pairs), checks.run_all(built, pairs),
               benefit.cache_benefit(built, step_table))
    del pairs
    table = built.table
    if table.device is None:
        return figures + (None,)
    measured_here.wait()
    return figures + (device.per_range(table),)


def _malformed_check(table) -> list[dict]:
    """The check on the events the reader skipped, where it skipped any."""
    from mmscope.analyze.readers import malformed

    found = malformed.check(table.malformed.doc() if table.malformed else None)
    return [found] if found else []


def profile_info(path: str, built) -> dict:
    from mmscope.analyze.ranges import device
    from mmscope.analyze.ranges.table import MARK
    from mmscope.analyze.readers import malformed

    table = built.table
    work = table.device
    n = len(table)
    return {"path": path, "format": table.source, "clock": table.clock, "ranges": n,
            "marks": int((table.kind == MARK).sum()),
            "unclosed": int(table.unclosed.sum()),
            "cross_thread": len(table.ends_elsewhere[0]),
            "threads": sum(len(p["threads"]) for p in built.processes),
            "processes": built.processes, "roles": built.roles,
            "span_ns": int(table.end.max() - table.start.min()) if n else 0,
            "malformed": (table.malformed or malformed.Skipped(events=n)).doc(),
            "slack_ns": table.slack_ns,
            "device": ({"available": False, "reason": table.no_device} if work is None else
                       {"available": True, "source": work.source, "ops": len(work),
                        "streams": device.streams(work)})}


def stage_stats(table, name_filter: str | None = None, raw_names: bool = False) -> list[dict]:
    """The flat per-stage table of a range table (what `mmscope compare` compares)."""
    from mmscope.analyze.ranges import frame, stats

    built = frame.build(table, raw_names)
    by_node, by_stage = stats.aggregate(built)
    return stats.flat(built, by_node, by_stage, name_filter)
