"""Run every computation on a RangeTable once, and render the result as JSON, CSV or a rich table.

The JSON holds the same numbers as the table: stages, checks, steps, cache_benefit, profile.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass

import numpy as np

from mmscope.analysis import benefit, checks, stats, steps
from mmscope.analysis.table import MARK, RangeTable

CSV_FIELDS = ("name", "count", "total_ns", "mean_ns", "p50_ns", "p90_ns", "p99_ns", "min_ns",
              "max_ns", "parent", "share_of_parent")


@dataclass
class Analysis:
    path: str
    table: RangeTable
    stages: list[dict]
    checks: list[dict]
    steps: dict
    cache_benefit: dict
    pairs: object  # polars DataFrame of the step join, for the plots

    def to_json(self) -> dict:
        return {"profile": profile_info(self.path, self.table), "stages": self.stages,
                "checks": self.checks, "steps": self.steps, "cache_benefit": self.cache_benefit}


def analyze(path: str, table: RangeTable, name_filter: str | None = None) -> Analysis:
    pairs = steps.step_join(table)
    return Analysis(path=path, table=table, stages=stats.stage_stats(table, name_filter),
                    checks=checks.run_all(table, pairs), steps=steps.summary(table, pairs),
                    cache_benefit=benefit.cache_benefit(table), pairs=pairs)


def profile_info(path: str, table: RangeTable) -> dict:
    import polars as pl

    n = len(table)
    threads = pl.Series(table.thread).unique().to_numpy() if n else np.zeros(0, np.int64)
    return {"path": path, "format": table.source, "ranges": n,
            "marks": int((table.kind == MARK).sum()),
            "unclosed": int(table.unclosed.sum()),
            "cross_thread": int((table.end_thread != table.thread).sum()),
            "threads": len(threads),
            "processes": len(np.unique((threads >> 24) & 0xFFFFFF)),
            "span_ns": int(table.end.max() - table.start.min()) if n else 0}


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
    info = profile_info(analysis.path, analysis.table)
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
