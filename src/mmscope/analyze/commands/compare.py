"""`mmscope compare BASE NEW`: per-stage deltas between two profiles, the biggest movers flagged.

Means are compared (run lengths differ, so totals only give context); JSON with --json.
"""
from __future__ import annotations

import argparse
import json
import sys

MOVED_TOP = 3          # at most this many stages are flagged
MOVED_MIN_PCT = 5.0    # a mean that moved less than this is noise on these machines
MOVED_MIN_COUNT = 2    # a single range is no mean to compare


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from mmscope.analyze.commands.analyze import add_stage_options

    parser.add_argument("base", help="the baseline profile")
    parser.add_argument("new", help="the profile to compare against it")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_stage_options(parser)
    parser.add_argument("--no-cache", action="store_true",
                        help="compute both stage tables even where the analysis cache holds them")


def _pct(new, base):
    return None if not base else round(100.0 * (new - base) / base, 2)


def compare(base: list[dict], new: list[dict]) -> dict:
    """Per-stage rows (union of both profiles) and the names of the stages that moved most."""
    b = {r["name"]: r for r in base}
    n = {r["name"]: r for r in new}
    rows = []
    for name in list(b) + [k for k in n if k not in b]:
        rb, rn = b.get(name), n.get(name)
        row = {"name": name, "status": "both" if rb and rn else ("removed" if rb else "added"),
               "base": _brief(rb), "new": _brief(rn), "moved": False}
        if rb and rn:
            for k in ("mean_ns", "p50_ns", "total_ns"):
                row[f"delta_{k}"] = rn[k] - rb[k]
                row[f"delta_{k[:-3]}_pct"] = _pct(rn[k], rb[k])
        rows.append(row)
    movers = _movers(rows)
    for row in rows:
        row["moved"] = row["name"] in movers
    return {"stages": rows, "moved_most": movers}


def _brief(r: dict | None) -> dict | None:
    if r is None:
        return None
    return {k: r[k] for k in ("count", "total_ns", "mean_ns", "p50_ns", "p90_ns", "max_ns")}


def _movers(rows: list[dict]) -> list[str]:
    def eligible(r):
        return (r["status"] == "both" and r["delta_mean_pct"] is not None
                and abs(r["delta_mean_pct"]) >= MOVED_MIN_PCT
                and min(r["base"]["count"], r["new"]["count"]) >= MOVED_MIN_COUNT)
    # Rank by time actually gained or lost per range times how often it runs in the new profile.
    ranked = sorted((r for r in rows if eligible(r)),
                    key=lambda r: -abs(r["delta_mean_ns"]) * r["new"]["count"])
    return [r["name"] for r in ranked[:MOVED_TOP]]


def _stages(path: str, name_filter: str | None, workers: int | None, no_cache: bool,
            raw_names: bool):
    """The stage table of a profile: from the analysis cache where `mmscope analyze` left it,
    else computed (the stage table only; compare stores nothing)."""
    from mmscope.analyze.commands import cache

    doc = None if no_cache else cache.read(cache.key_for(path, name_filter, raw_names))
    if doc is not None:
        return doc["stages"]
    from mmscope.analyze import load
    from mmscope.analyze.commands.analyze import compiling_said
    from mmscope.analyze.readers import malformed
    from mmscope.analyze.report.analysis import stage_stats

    with compiling_said():
        table = load(path, workers=workers)
        said = malformed.line(table.malformed.doc() if table.malformed else None)
        if said:
            print(f"mmscope: {path}: {said}", file=sys.stderr)
        return stage_stats(table, name_filter, raw_names)


def run(args) -> int:
    from mmscope.analyze.commands.analyze import check_regex, check_workers

    check_regex(args.filter)
    check_workers(args.workers)
    base = _stages(args.base, args.filter, args.workers, args.no_cache, args.raw_names)
    new = _stages(args.new, args.filter, args.workers, args.no_cache, args.raw_names)
    result = {"base": args.base, "new": args.new, **compare(base, new)}
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print_terminal(result)
    return 0


def _flag(row: dict):
    from rich.text import Text

    if row["moved"]:
        return Text("moved", style="bold red")
    return "" if row["status"] == "both" else row["status"]


def print_terminal(result: dict) -> None:
    from rich.table import Table

    from mmscope.analyze.report.terminal import make_console, text
    from mmscope.analyze.report.text import fmt_ns

    t = Table(title=text(f"{result['base']} -> {result['new']}"), title_justify="left")
    for col in ("stage", "count", "mean base", "mean new", "Δ mean", "Δ %", "total new", ""):
        t.add_column(col, justify="left" if col in ("stage", "") else "right")
    for r in result["stages"]:
        rb, rn = r["base"] or {}, r["new"] or {}
        pct = r.get("delta_mean_pct")
        t.add_row(text(r["name"]), f"{rb.get('count', 0)} -> {rn.get('count', 0)}",
                  fmt_ns(rb.get("mean_ns")), fmt_ns(rn.get("mean_ns")),
                  fmt_ns(r.get("delta_mean_ns")), "" if pct is None else f"{pct:+.1f}%",
                  fmt_ns(rn.get("total_ns")),
                  _flag(r))
    console = make_console()
    console.print(t)
    if result["moved_most"]:
        console.print(text("moved most: " + ", ".join(result["moved_most"])))
