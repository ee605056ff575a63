"""Run every computation on a RangeTable once, and render the result as JSON, CSV or rich tables.

The JSON holds what the terminal shows: profile, tree, stages, checks, steps, cache_benefit,
per_step, cache (from a /metrics page).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass

# Rendering runs on cached analyses too, without numpy: the computing modules load on first use.
CSV_FIELDS = ("name", "count", "total_ns", "self_ns", "device_ns", "kernel_ns", "mean_ns",
              "p50_ns", "p90_ns", "p99_ns", "min_ns", "max_ns", "parent", "share_of_parent",
              "in_parent", "parent_count")
DOC_KEYS = ("profile", "tree", "stages", "checks", "steps", "cache_benefit", "per_step")
TREE_MIN_SHARE = 0.005  # the terminal's tree leaves out other nodes below this share of a role


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
            workers: int | None = None) -> Analysis:
    from mmscope.analyze import benefit, checks, frame, per_step, stats, steps

    built = frame.build(table, workers)
    try:
        by_node, by_stage = stats.aggregate(built.sql, table.device is not None)
        pairs = steps.step_join(built)
        step_table = steps.steps_of(built, pairs)
        return Analysis(
            path=path, profile=profile_info(path, built),
            tree=stats.tree(built, by_node, name_filter),
            stages=stats.flat(built, by_node, by_stage, name_filter),
            checks=checks.run_all(built, pairs), steps=steps.summary(built, pairs),
            cache_benefit=benefit.cache_benefit(built, step_table),
            per_step=per_step.per_step(built, step_table))
    finally:
        built.close()


def profile_info(path: str, built) -> dict:
    from mmscope.analyze import device
    from mmscope.analyze.table import MARK

    table = built.table
    work = table.device
    n = len(table)
    return {"path": path, "format": table.source, "clock": table.clock, "ranges": n,
            "marks": int((table.kind == MARK).sum()),
            "unclosed": int(table.unclosed.sum()),
            "cross_thread": (0 if table.end_thread is table.thread  # one array: none crosses
                             else int((table.end_thread != table.thread).sum())),
            "threads": sum(len(p["threads"]) for p in built.processes),
            "processes": built.processes, "roles": built.roles,
            "span_ns": int(table.end.max() - table.start.min()) if n else 0,
            "slack_ns": table.slack_ns,
            "device": ({"available": False, "reason": table.no_device} if work is None else
                       {"available": True, "source": work.source, "ops": len(work),
                        "streams": device.streams(work)})}


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


def fmt_share(share) -> str:
    return "" if share is None else f"{100 * share:.1f}%"


def make_console():
    from mmscope.console import report_console

    return report_console()


def print_terminal(analysis: Analysis, console=None, flat: bool = False) -> None:
    console = console or make_console()
    info = analysis.profile
    console.print(f"[bold]{info['path']}[/bold]  {info['format']}  {info['ranges']} ranges, "
                  f"{info['threads']} threads, {len(info['processes'])} processes, "
                  f"span {fmt_ns(info['span_ns'])}"
                  + (f", {info['unclosed']} unclosed" if info["unclosed"] else ""),
                  highlight=False)
    console.print(device_text(info["device"]), highlight=False)
    on_device = info["device"]["available"]
    if flat:
        console.print(_stage_table(analysis.stages, on_device))
    else:
        for role in info["roles"]:
            console.print(_tree_table(role, info["processes"], analysis.tree, on_device))
    for c in analysis.checks:
        mark = "[green]ok[/green]  " if c["ok"] else "[red]FAIL[/red]"
        console.print(f"{mark} {c['name']}: {c['detail']}", highlight=False)
    console.print(_steps_text(analysis.steps), highlight=False)
    console.print(_benefit_text(analysis.cache_benefit), highlight=False)
    if analysis.cache:
        console.print(_cache_text(analysis.cache), highlight=False)


def device_text(d: dict) -> str:
    """The profile's device side in one line, or why it has none (said once)."""
    if not d["available"]:
        return f"device time: none ({d['reason']})"
    streams = ", ".join(f"{s['stream']} {s['ops']} ops" for s in d["streams"][:6])
    more = len(d["streams"]) - 6
    return (f"device time: {d['ops']} GPU ops ({d['source']}) on {streams}"
            + (f" and {more} more streams" if more > 0 else "")
            + "; device = the span of the ops a range launched, kernels = their summed time")


def where_text(role: str, processes: list[dict]) -> str:
    """The processes and threads of a role, named where the profile names them."""
    parts = []
    for p in processes:
        if p["role"] != role:
            continue
        threads = ", ".join(f"{t['tid']}" + (f" {t['name']}" if t["name"] else "")
                            for t in p["threads"])
        parts.append(f"pid {p['pid']}" + (f" {p['name']}" if p["name"] else "")
                     + f" (thread {threads})")
    return "; ".join(parts)


def tree_prefixes(nodes: list[dict]) -> list[str]:
    """Box-drawing prefixes of nodes listed depth first (├─, └─, │)."""
    last_child = {}
    for i, n in enumerate(nodes):
        last_child[n["parent"]] = i
    out, open_levels = [], []
    for i, n in enumerate(nodes):
        depth = n["depth"]
        del open_levels[depth:]
        if depth == 0:
            out.append("")
        else:
            is_last = last_child[n["parent"]] == i
            out.append("".join("│  " if o else "   " for o in open_levels[1:])
                       + ("└─ " if is_last else "├─ "))
        open_levels.append(depth == 0 or last_child[n["parent"]] != i)
    return out


def catalogued(name: str) -> bool:
    """A range of mmscope's stage catalogue (docs/design.md §3), which the tree never hides."""
    from mmscope import stages

    return (name in stages.ALL_FIXED
            or name.startswith((stages.HASH_PREFIX, stages.PROCESSOR_PREFIX, stages.MEDIA_PREFIX)))


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
        return (f"{role}: {where_text(role, processes)}: {hidden} nodes outside the stage "
                f"catalogue, each under {100 * TREE_MIN_SHARE:g}% of the role's time")
    t = Table(title=f"{role}: {where_text(role, processes)}", title_justify="left",
              caption=(f"{hidden} nodes outside the stage catalogue under "
                       f"{100 * TREE_MIN_SHARE:g}% of the role's time not shown (--json, --html "
                       "and --flat show every one)") if hidden else None,
              caption_justify="left")
    for col in ("stage", "count", "total", "self") + DEVICE_COLUMNS * on_device + (
            "mean", "p50", "p90", "p99", "% of parent"):
        t.add_column(col, justify="left" if col == "stage" else "right")
    for prefix, n in zip(tree_prefixes(shown), shown):
        t.add_row(prefix + n["name"], str(n["count"]), fmt_ns(n["total_ns"]),
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
        t.add_row(r["name"], str(r["count"]), fmt_ns(r["total_ns"]), fmt_ns(r["self_ns"]),
                  *_device_cells(r, on_device),
                  fmt_ns(r["mean_ns"]), fmt_ns(r["p50_ns"]), fmt_ns(r["p90_ns"]),
                  fmt_ns(r["p99_ns"]), fmt_ns(r["max_ns"]), fmt_share(r["share_of_parent"]),
                  parent)
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
    for outcome, split in (c["ttft"] or {}).items():
        if not split["requests"]:
            continue
        parts = ", ".join(f"{p} {v['mean_ms']:g} ms" for p, v in split["parts"].items()
                          if v["mean_ms"] is not None)
        lines.append(f"  time to first token, {outcome}s ({split['requests']} requests): mean "
                     f"{split['ttft']['mean_ms']:g} ms = {parts}")
    return "\n".join(lines)
