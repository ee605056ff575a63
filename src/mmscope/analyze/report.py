"""Run every computation on a RangeTable once, and render the result as JSON, CSV or a rich table.

The JSON holds the same numbers as the table: stages, checks, steps, cache_benefit, profile.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field

# Rendering runs on cached analyses too, without numpy: the computing modules load on first use.
CSV_FIELDS = ("name", "count", "total_ns", "mean_ns", "p50_ns", "p90_ns", "p99_ns", "min_ns",
              "max_ns", "parent", "share_of_parent")
MAX_POINTS = 20_000  # scatter plots sample down to this many points; reports stay small


@dataclass
class Analysis:
    """Everything the outputs show; `table` and `pairs` only where computed in this process (an
    analysis from the cache has the rest: `doc()` is what the cache stores)."""

    path: str
    profile: dict
    stages: list[dict]
    checks: list[dict]
    steps: dict
    cache_benefit: dict
    plots: dict = field(default_factory=dict)  # sampled points of the HTML report's scatters
    table: object = None  # RangeTable
    pairs: object = None  # steps.StepPairs

    def to_json(self) -> dict:
        return {"profile": self.profile, "stages": self.stages, "checks": self.checks,
                "steps": self.steps, "cache_benefit": self.cache_benefit}

    def doc(self) -> dict:
        return {**self.to_json(), "plots": self.plots}

    @classmethod
    def from_doc(cls, path: str, doc: dict) -> "Analysis":
        """The analysis of a cache entry, under the path the user gave this time."""
        profile = dict(doc["profile"])
        profile["path"] = path
        return cls(path=path, profile=profile, stages=doc["stages"], checks=doc["checks"],
                   steps=doc["steps"], cache_benefit=doc["cache_benefit"], plots=doc["plots"])


def analyze(path: str, table, name_filter: str | None = None) -> Analysis:
    from mmscope import stages
    from mmscope.analyze import benefit, checks, stats, steps

    table.find_rows((stages.FORWARD,), (stages.PREPROCESS,), (stages.VIT_FORWARD,),
                    (stages.EC_SAVE,), checks.SIBLINGS,
                    id_sets={steps.STEP_META_ROWS: steps.step_meta_shapes(table)[1]})
    pairs = steps.step_join(table)
    return Analysis(path=path, profile=profile_info(path, table), table=table,
                    stages=stats.stage_stats(table, name_filter),
                    checks=checks.run_all(table, pairs), steps=steps.summary(table, pairs),
                    cache_benefit=benefit.cache_benefit(table), pairs=pairs,
                    plots=plot_points(table, pairs))


def profile_info(path: str, table) -> dict:
    import numpy as np

    from mmscope.analyze.table import MARK

    import polars as pl

    n = len(table)
    threads = pl.Series(table.thread).unique().to_numpy()
    return {"path": path, "format": table.source, "clock": table.clock, "ranges": n,
            "marks": int((table.kind == MARK).sum()),
            "unclosed": int(table.unclosed.sum()),
            "cross_thread": (0 if table.end_thread is table.thread  # one array: none crosses
                             else int((table.end_thread != table.thread).sum())),
            "threads": len(threads),
            "processes": len(np.unique((threads >> 24) & 0xFFFFFF)),
            "span_ns": int(table.end.max() - table.start.min()) if n else 0}


def sample(n: int):
    """Positions of at most MAX_POINTS of n points, in order (the same ones every run)."""
    import numpy as np

    if n <= MAX_POINTS:
        return np.arange(n)
    return np.sort(np.random.default_rng(0).choice(n, MAX_POINTS, replace=False))


def plot_points(table, pairs) -> dict:
    """The points the HTML report plots, as plain lists (they go into the cache as JSON):
    forward time against the step's tokens, and per preprocess step its time and encoder time."""
    from mmscope.analyze import benefit

    out: dict = {"forward": None, "encoder": None}
    if pairs is not None and len(pairs):
        idx = sample(len(pairs))
        out["forward"] = {k: pairs[k][idx].tolist()
                          for k in ("total", "forward_ns", "prefill", "decode")}
    pre, enc = benefit.encoder_per_step(table)
    if len(pre):
        idx = sample(len(pre))
        rows = pre[idx]
        out["encoder"] = {"step": idx.tolist(),
                          "preprocess_ns": (table.end[rows] - table.start[rows]).tolist(),
                          "encoder_ns": enc[idx].tolist()}
    return out


def write_csv(analysis: Analysis, path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for row in analysis.stages:
            w.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in CSV_FIELDS})


def fmt_ns(ns) -> str:
    """A duration as people read it: 850 ns, 12.3 µs, 4.56 ms, 1.23 s."""
    if ns is None:
        return "-"
    ns = float(ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.0f} ns"


def make_console():
    """A rich console; piped output gets wide lines rather than 80 columns of wrapped names."""
    import sys

    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=160)


def print_terminal(analysis: Analysis, console=None) -> None:
    console = console or make_console()
    info = analysis.profile
    console.print(f"[bold]{info['path']}[/bold]  {info['format']}  {info['ranges']} ranges, "
                  f"{info['threads']} threads, {info['processes']} processes, "
                  f"span {fmt_ns(info['span_ns'])}"
                  + (f", {info['unclosed']} unclosed" if info["unclosed"] else ""))
    console.print(_stage_table(analysis.stages))
    for c in analysis.checks:
        mark = "[green]ok[/green]  " if c["ok"] else "[red]FAIL[/red]"
        console.print(f"{mark} {c['name']}: {c['detail']}", highlight=False)
    console.print(_steps_text(analysis.steps), highlight=False)
    console.print(_benefit_text(analysis.cache_benefit), highlight=False)


def _stage_table(rows: list[dict]):
    from rich.table import Table

    t = Table(title="stages (durations per range)", title_justify="left")
    for col in ("stage", "count", "total", "mean", "p50", "p90", "p99", "max", "% of parent",
                "parent"):
        t.add_column(col, justify="left" if col in ("stage", "parent") else "right")
    for r in rows:
        share = "" if r["share_of_parent"] is None else f"{100 * r['share_of_parent']:.1f}%"
        t.add_row(r["name"], str(r["count"]), fmt_ns(r["total_ns"]), fmt_ns(r["mean_ns"]),
                  fmt_ns(r["p50_ns"]), fmt_ns(r["p90_ns"]), fmt_ns(r["p99_ns"]),
                  fmt_ns(r["max_ns"]), share, r["parent"] or "")
    return t


def _steps_text(s: dict) -> str:
    if s.get("available") is False:
        return f"steps: {s['reason']}"
    lines = [f"steps: {s['pairs']} forwards joined to a step_meta ({s['forwards']} forwards, "
             f"{s['step_metas']} step_meta)"]
    for k in s["by_kind"]:
        lines.append(f"  {k['kind']:>7}: {k['steps']} steps, forward mean "
                     f"{fmt_ns(k['forward_mean_ns'])}, p50 {fmt_ns(k['forward_p50_ns'])}, "
                     f"{k['tokens_mean']:g} tokens on average")
    if s["fit"]:
        f = s["fit"]
        lines.append(f"  forward ≈ {fmt_ns(f['intercept_ns'])} + {fmt_ns(f['ns_per_token'])} "
                     f"per token (r² {f['r2']})")
    elif s.get("fit_reason"):
        lines.append(f"  no fit of forward time against tokens: {s['fit_reason']}")
    return "\n".join(lines)


def _benefit_text(b: dict) -> str:
    if not b["available"]:
        return f"cache benefit: {b['reason']}"
    w, wo, e = b["with_encoder"], b["without_encoder"], b["encoder_per_step"]
    saved = b["preprocess_saved_per_hit_step_ns"]
    return "\n".join([
        f"cache benefit: {b['preprocess_steps']} preprocess steps, "
        f"{100 * b['encoder_step_fraction']:.1f}% ran the encoder",
        f"  preprocess with encoder: mean {fmt_ns(w['mean_ns'])} ({w['steps']} steps); "
        f"without: mean {fmt_ns(wo['mean_ns'])} ({wo['steps']} steps)",
        f"  encoder per step that ran it: mean {fmt_ns(e['mean_ns'])}, p50 {fmt_ns(e['p50_ns'])}"
        + ("" if saved is None else f"; a step without encoder work saves {fmt_ns(saved)}")])
