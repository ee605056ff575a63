"""The analysis rendered for a terminal (rich tables) and as CSV (the flat stage table).

Names are printed as written: no text from the profile is read as rich markup.
"""
from __future__ import annotations

import csv

from mmscope.analyze.readers import malformed
from mmscope.analyze.report.analysis import Analysis
from mmscope.expose import layers
from mmscope.analyze.report.text import (catalogued, device_text, fmt_ns, fmt_share,
                                         tree_prefixes, where_text)

CSV_FIELDS = ("name", "count", "total_ns", "self_ns", "device_ns", "kernel_ns", "mean_ns",
              "p50_ns", "p90_ns", "p99_ns", "min_ns", "max_ns", "parent", "share_of_parent",
              "in_parent", "parent_count")
TREE_MIN_SHARE = 0.005  # the terminal's tree leaves out other nodes below this share of a role


def write_csv(analysis: Analysis, path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for row in analysis.stages:
            w.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in CSV_FIELDS})


def make_console():
    """The commands' report console, reading no markup: names are printed as written."""
    from mmscope.console import report_console

    return report_console(markup=False, highlight=False)


def text(plain: str, style: str = ""):
    """A line or cell as written, whatever brackets it holds (rich reads none of it)."""
    from rich.text import Text

    return Text(plain, style=style)


def named(row: dict) -> str:
    """A stage as the tables show it: a family says how many names it holds."""
    family = row.get("family")
    return row["name"] + (f"  ({family['names']} names)" if family else "")


def print_terminal(analysis: Analysis, console=None, flat: bool = False) -> None:
    from rich.text import Text

    console = console or make_console()
    info = analysis.profile
    console.print(Text.assemble((info["path"], "bold"), f"  {info['format']}  {info['ranges']} "
                                f"ranges, {info['threads']} threads, "
                                f"{len(info['processes'])} processes, "
                                f"span {fmt_ns(info['span_ns'])}"
                                + (f", {info['unclosed']} unclosed" if info["unclosed"] else "")))
    console.print(text(device_text(info["device"])))
    skipped = malformed.line(info.get("malformed"))
    if skipped:
        console.print(text(skipped, "yellow"))
    on_device = info["device"]["available"]
    if flat:
        console.print(_stage_table(analysis.stages, on_device))
    else:
        for role in info["roles"]:
            console.print(_tree_table(role, info["processes"], analysis.tree, on_device))
    for c in analysis.checks:
        mark = ("ok  ", "green") if c["ok"] else ("FAIL", "red")
        console.print(Text.assemble(mark, f" {c['name']}: {c['detail']}"))
    console.print(text(_steps_text(analysis.steps)))
    console.print(text(_benefit_text(analysis.cache_benefit)))
    if analysis.cache:
        console.print(text(_cache_text(analysis.cache)))


def _tree_table(role: str, processes: list[dict], nodes: list[dict], on_device: bool):
    from rich.table import Table

    mine = [n for n in nodes if n["role"] == role]
    roots = sum(n["total_ns"] for n in mine if n["parent"] is None) or 1
    by_id = {n["id"]: n for n in mine}
    kept: set[int] = set()
    for n in mine:  # a catalogue stage always, and the paths down to what is kept
        if n["total_ns"] >= TREE_MIN_SHARE * roots or catalogued(n["name"]):
            while n is not None and n["id"] not in kept:
                kept.add(n["id"])
                n = by_id.get(n["parent"])
    shown = [n for n in mine if n["id"] in kept]
    hidden = len(mine) - len(shown)
    if not shown:
        return text(f"{role}: {where_text(role, processes)}: {hidden} nodes outside the stage "
                    f"catalogue, each under {100 * TREE_MIN_SHARE:g}% of the role's time")
    t = Table(title=text(f"{role}: {where_text(role, processes)}"), title_justify="left",
              caption=text(f"{hidden} nodes outside the stage catalogue under "
                           f"{100 * TREE_MIN_SHARE:g}% of the role's time not shown (--json, "
                           "--html and --flat show every one)") if hidden else None,
              caption_justify="left")
    for col in ("stage", "count", "total", "self") + DEVICE_COLUMNS * on_device + (
            "mean", "p50", "p90", "p99", "% of parent"):
        t.add_column(col, justify="left" if col == "stage" else "right")
    for prefix, n in zip(tree_prefixes(shown), shown):
        t.add_row(text(prefix + named(n)), str(n["count"]), fmt_ns(n["total_ns"]),
                  fmt_ns(n["self_ns"]), *_device_cells(n, on_device), fmt_ns(n["mean_ns"]),
                  fmt_ns(n["p50_ns"]), fmt_ns(n["p90_ns"]), fmt_ns(n["p99_ns"]),
                  fmt_share(n["share_of_parent"]))
    return t


DEVICE_COLUMNS = ("device", "kernels")


def _device_cells(row: dict, on_device: bool) -> list[str]:
    return [fmt_ns(row["device_ns"]), fmt_ns(row["kernel_ns"])] if on_device else []


def _stage_table(rows: list[dict], on_device: bool):
    from rich.table import Table

    t = Table(title="stages (durations per range)", title_justify="left")
    for col in ("stage", "count", "total", "self") + DEVICE_COLUMNS * on_device + (
            "mean", "p50", "p90", "p99", "max", "% of parent", "parent"):
        t.add_column(col, justify="left" if col in ("stage", "parent") else "right")
    for r in rows:
        parent = "" if r["parent"] is None else (
            f"{r['parent']} ({r['in_parent']} in {r['parent_count']})")
        t.add_row(text(named(r)), str(r["count"]), fmt_ns(r["total_ns"]), fmt_ns(r["self_ns"]),
                  *_device_cells(r, on_device),
                  fmt_ns(r["mean_ns"]), fmt_ns(r["p50_ns"]), fmt_ns(r["p90_ns"]),
                  fmt_ns(r["p99_ns"]), fmt_ns(r["max_ns"]), fmt_share(r["share_of_parent"]),
                  text(parent))
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
                     f"per token (r² {f['r2']}, {f['steps']} steps)")
    elif s.get("fit_reason"):
        lines.append(f"  no fit of forward time against tokens: {s['fit_reason']}")
    return "\n".join(lines)


def _side(side: dict) -> str:
    if not side["steps"]:
        return "no step"
    encoder = side.get("encoder_mean_ns")
    return (f"mean {fmt_ns(side['mean_ns'])} ({side['steps']} steps"
            + (f"; the encoder {fmt_ns(encoder)} of it" if encoder is not None else "") + ")")


def _kind_text(row: dict) -> str:
    sides = [f"{label} {_side(row[key])}" for key, label in
             (("with_encoder", "with encoder work"), ("without_encoder", "without"))
             if row[key]["steps"]]
    return f"{row['kind']}: " + ", ".join(sides)


def _benefit_text(b: dict) -> str:
    if not b["available"]:
        return f"cache benefit: {b['reason']}"
    e, left = b["encoder"], b["without_forward"]
    lines = [f"cache benefit: {b['steps']} steps (a preprocess a forward follows), "
             f"{b['encoder_steps']} ran the encoder ({100 * b['encoder_step_fraction']:.1f}%)"]
    if b["compared_kind"] is None:
        lines.append(f"  like for like: {b['comparison_reason']}")
    else:
        row = next(r for r in b["by_kind"] if r["kind"] == b["compared_kind"])
        lines.append(f"  {b['compared_kind']} steps: preprocess with encoder work "
                     f"{_side(row['with_encoder'])}, without {_side(row['without_encoder'])}: "
                     f"a {b['compared_kind']} step without encoder work spends "
                     f"{fmt_ns(b['preprocess_saved_ns'])} less in preprocess")
    lines.append(f"  the encoder itself: mean {fmt_ns(e['mean_ns'])}, p50 {fmt_ns(e['p50_ns'])} "
                 f"over the {e['steps']} steps that ran it ("
                 f"{fmt_share(b['encoder_share_of_preprocess'])} of their preprocess)")
    others = [_kind_text(r) for r in b["by_kind"] if r["kind"] != b["compared_kind"]]
    if others:
        lines.append("  other kinds: " + "; ".join(others))
    if left["ranges"]:
        lines.append(f"  {left['ranges']} preprocess ranges no forward follows (mean "
                     f"{fmt_ns(left['mean_ns'])}) are no step and left out")
    return "\n".join(lines)


def _cache_text(c: dict) -> str:
    counts = c["counters"]
    rate = "-" if c["hit_rate"] is None else f"{100 * c['hit_rate']:.1f}%"
    lines = [f"encoder cache ({c['source']}): hit rate {rate} ({counts['encoder_cache_hits']} "
             f"hits of {counts['encoder_cache_queries']} queries; "
             + ", ".join(f"{k.removeprefix('encoder_cache_')} {v}" for k, v in counts.items()
                         if k not in ("encoder_cache_hits", "encoder_cache_queries"))
             + "); hits by source: "
             + ", ".join(f"{k} {v}" for k, v in c["hits_by_source"].items())]
    if c.get("layers"):
        lines += [f"  {line}" for line in layers.lines(c["layers"])]
    for outcome, split in (c["ttft"] or {}).items():
        if not split["requests"]:
            continue
        parts = ", ".join(f"{p} {v['mean_ms']:g} ms" for p, v in split["parts"].items()
                          if v["mean_ms"] is not None)
        lines.append(f"  time to first token, {outcome}s ({split['requests']} requests): mean "
                     f"{split['ttft']['mean_ms']:g} ms = {parts}")
    return "\n".join(lines)
