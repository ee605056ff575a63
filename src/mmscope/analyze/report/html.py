"""The HTML report: one self-contained file (style, script and data inline; nothing fetched) that
shows the stage tree per role as an icicle and a table, self time by stage, host against device
time by stage and the kernels under each stage, the checks, the per-step view, the steps and the
encoder cache (benefit, and counters and time to first token when a /metrics page was given).
"""
from __future__ import annotations

import html
import json

from mmscope.analyze.report.analysis import Analysis
from mmscope.expose import layers
from mmscope.analyze.report.text import device_text, fmt_ns, fmt_share, tree_prefixes, where_text
from mmscope.analyze.report.html_script import CSS, JS


def write_html(analysis: Analysis, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(analysis))


def render(analysis: Analysis) -> str:
    info = analysis.profile
    on_device = info["device"]["available"]
    parts = [f"<h1>mmscope analyze: {_e(info['path'])}</h1>",
             f"<p>{_e(info['format'])}, {_e(info['clock'])}: {info['ranges']} ranges, "
             f"{info['threads']} threads, {len(info['processes'])} processes, span "
             f"{fmt_ns(info['span_ns'])}</p>",
             f"<p id='device-note'>{_e(device_text(info['device']))}</p>",
             _processes(info["processes"]),
             "<h2>Checks</h2>", _checks(analysis.checks),
             "<h2>Stage tree</h2><p class='note'>Per process role, each stage under the stage "
             "that holds it; width is total time, a darker box has more self time (its time "
             "less its children's). Hover for the figures, click to zoom in or out.</p>"]
    for role in info["roles"]:
        parts += [f"<h3>{_e(role)}: {_e(where_text(role, info['processes']))}</h3>",
                  f"<div class='icicle-holder' data-role='{_e(role)}'></div>",
                  "<p class='note'>Self time by stage: where the time goes, counted once.</p>",
                  f"<div class='self-holder' data-role='{_e(role)}'></div>",
                  _tree_table([n for n in analysis.tree if n["role"] == role], on_device)]
    if on_device:
        parts += ["<h2>Where the GPU time went</h2><p class='note'>Per stage, its ranges' host "
                  "time (launching the work) beside their device time (first GPU op started to "
                  "last ended, of the ops they launched).</p><div id='host-device'></div>",
                  "<h3>Kernels under each stage</h3>", _kernels(analysis.stages)]
    parts += ["<h2>Steps</h2>", _per_step_note(analysis.per_step),
              "<div id='per-step'></div>", _steps(analysis.steps),
              "<h2>Encoder cache</h2>", _benefit(analysis.cache_benefit),
              _cache(analysis.cache),
              "<h2>Stages, flat</h2>", _flat_table(analysis.stages, on_device)]
    stages = [{k: r[k] for k in ("name", "total_ns", "device_ns", "kernel_ns")}
              for r in analysis.stages] if on_device else None
    data = json.dumps({"tree": analysis.tree, "per_step": analysis.per_step, "stages": stages},
                      separators=(",", ":")).replace("</", "<\\/")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>mmscope report</title>"
            f"<style>{CSS}</style></head><body>{''.join(parts)}<div id='tip'></div>"
            f"<script id='analysis' type='application/json'>{data}</script>"
            f"<script>{JS}</script></body></html>\n")


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _table(head: list[str], rows: list[list], classes: dict[int, str] | None = None) -> str:
    classes = classes or {}
    body = "".join("<tr>" + "".join(
        f"<td class='{classes[j]}'>{c}</td>" if j in classes else f"<td>{c}</td>"
        for j, c in enumerate(row)) + "</tr>" for row in rows)
    return ("<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + f"</tr>{body}</table>")


def _processes(processes: list[dict]) -> str:
    rows = [[p["pid"], _e(p["name"] or ""), _e(p["role"]),
             ", ".join(_e(f"{t['tid']}" + (f" {t['name']}" if t["name"] else "")
                          + f": {t['ranges']}") for t in p["threads"]), p["ranges"]]
            for p in processes]
    return _table(["pid", "process", "role", "threads (tid name: ranges)", "ranges"], rows)


def _checks(rows: list[dict]) -> str:
    items = [f"<li><span class='{'ok' if c['ok'] else 'fail'}'>{'ok' if c['ok'] else 'FAIL'}"
             f"</span> {_e(c['name'])}: {_e(c['detail'])}</li>" for c in rows]
    return f"<ul>{''.join(items)}</ul>"


def _head(on_device: bool) -> list[str]:
    return (["count", "total", "self"] + ["device", "kernels"] * on_device
            + ["mean", "p50", "p90", "p99"])


def _figures(r: dict, on_device: bool) -> list:
    keys = (("total_ns", "self_ns") + ("device_ns", "kernel_ns") * on_device
            + ("mean_ns", "p50_ns", "p90_ns", "p99_ns"))
    return [r["count"]] + [fmt_ns(r[k]) for k in keys]


def _tree_table(nodes: list[dict], on_device: bool) -> str:
    rows = [[_e(prefix + n["name"])] + _figures(n, on_device) + [fmt_share(n["share_of_parent"])]
            for prefix, n in zip(tree_prefixes(nodes), nodes)]
    return _table(["stage"] + _head(on_device) + ["% of parent"], rows, {0: "name"})


def _flat_table(stages: list[dict], on_device: bool) -> str:
    rows = [[_e(r["name"])] + _figures(r, on_device)
            + [fmt_ns(r["max_ns"]), fmt_share(r["share_of_parent"]),
               "" if r["parent"] is None else
               _e(f"{r['parent']} ({r['in_parent']} in {r['parent_count']})")] for r in stages]
    return _table(["stage"] + _head(on_device) + ["max", "% of parent", "parent"], rows)


KERNEL_NAME_CHARS = 90  # demangled template names run to thousands of characters


def _kernels(stages: list[dict]) -> str:
    """Per stage that launched GPU work, its top kernels by time (an op counts under every
    range holding it)."""
    rows = []
    for r in stages:
        for k in r["kernels"]:
            name = k["name"] if len(k["name"]) <= KERNEL_NAME_CHARS else (
                k["name"][:KERNEL_NAME_CHARS - 1] + "…")
            rows.append(f"<tr class='kernel' data-stage='{_e(r['name'])}' "
                        f"data-total-ns='{k['total_ns']}'><td>{_e(r['name'])}</td>"
                        f"<td title='{_e(k['name'])}'>{_e(name)}</td><td>{k['count']}</td>"
                        f"<td>{fmt_ns(k['total_ns'])}</td></tr>")
    if not rows:
        return "<p>No stage launched GPU work.</p>"
    return ("<table class='kernels'><tr><th>stage</th><th>kernel</th><th>ops</th><th>time</th>"
            f"</tr>{''.join(rows)}</table>")


def _per_step_note(view: dict | None) -> str:
    if view is None:
        return "<p>No step: no forward follows a preprocess range on its thread.</p>"
    return (f"<p class='note'>Each step (a preprocess range and what follows on its thread "
            f"until the next) as a stacked bar at its start time: {view['shown']} of "
            f"{view['steps']} steps shown, taken evenly over the profile. The strip below the "
            "bars tells the step's kind by its step_meta shape.</p>")


def _steps(s: dict) -> str:
    if s.get("available") is False:
        return f"<p>{_e(s['reason'])}</p>"
    rows = [[k["kind"], k["steps"], fmt_ns(k["forward_mean_ns"]), fmt_ns(k["forward_p50_ns"]),
             f"{k['tokens_mean']:g}"] for k in s["by_kind"]]
    fit = (f"<p>forward ≈ {fmt_ns(s['fit']['intercept_ns'])} + "
           f"{fmt_ns(s['fit']['ns_per_token'])} per token (r² {s['fit']['r2']}, "
           f"{s['fit']['steps']} steps)</p>" if s["fit"] else f"<p>{_e(s['fit_reason'])}</p>")
    return (f"<p>{s['pairs']} forwards joined to a step_meta ({s['forwards']} forwards, "
            f"{s['step_metas']} step_meta)</p>"
            + _table(["kind", "steps", "forward mean", "forward p50", "tokens (mean)"], rows)
            + fit)


def _side(side: dict) -> list:
    if not side["steps"]:
        return [0, "-", "-", "-"]
    return [side["steps"], fmt_ns(side["mean_ns"]), fmt_ns(side["p50_ns"]),
            fmt_ns(side.get("encoder_mean_ns"))]


def _benefit(b: dict) -> str:
    if not b["available"]:
        return f"<h3>Benefit</h3><p>{_e(b['reason'])}</p>"
    rows = [[r["kind"]] + _side(r["with_encoder"]) + _side(r["without_encoder"])[:3]
            + [fmt_ns(r["difference_ns"])] for r in b["by_kind"]]
    head = ["kind", "steps with encoder work", "preprocess mean", "p50", "of it the encoder",
            "steps without", "preprocess mean", "p50", "difference"]
    e, left = b["encoder"], b["without_forward"]
    headline = ("no kind of step has steps both with and without encoder work"
                if b["compared_kind"] is None else
                f"a {b['compared_kind']} step without encoder work spends "
                f"{fmt_ns(b['preprocess_saved_ns'])} less in preprocess")
    return (f"<h3>Benefit, like for like</h3><p>{b['steps']} steps (a preprocess a forward "
            f"follows), {b['encoder_steps']} ran the encoder: {_e(headline)}. The encoder "
            f"itself: mean {fmt_ns(e['mean_ns'])}, p50 {fmt_ns(e['p50_ns'])} over "
            f"{e['steps']} steps ({fmt_share(b['encoder_share_of_preprocess'])} of their "
            f"preprocess).</p>" + _table(head, rows)
            + (f"<p class='note'>{left['ranges']} preprocess ranges no forward follows (mean "
               f"{fmt_ns(left['mean_ns'])}) are no step and left out.</p>"
               if left["ranges"] else ""))


def _cache(c: dict | None) -> str:
    if c is None:
        return ("<p class='note'>Counters and time to first token: give the server's /metrics "
                "page (<code>mmscope analyze PROFILE --metrics URL_OR_FILE</code>).</p>")
    rate = "-" if c["hit_rate"] is None else f"{100 * c['hit_rate']:.1f}%"
    counts = [[_e(k), v] for k, v in c["counters"].items()]
    counts += [[_e(f"hits from {k}"), v] for k, v in c["hits_by_source"].items()]
    out = (f"<h3>Counters ({_e(c['source'])})</h3><p>hit rate <b>{rate}</b></p>"
           + _table(["counter", "items"], counts))
    if c.get("layers"):
        rows = [[_e(name), items, "" if saved is None else f"{saved:.4f}"]
                for name, items, saved in layers.rows(c["layers"])]
        out += ("<h3>Where items were served from</h3>"
                + _table(["layer", "items", "work saved (s)"], rows))
    for outcome, split in (c["ttft"] or {}).items():
        if not split["requests"]:
            continue
        rows = [["time to first token"] + _ms(split["ttft"])]
        rows += [[_e(p)] + _ms(v) for p, v in split["parts"].items()]
        out += (f"<h3>Time to first token, {outcome}s ({split['requests']} requests)</h3>"
                + _table(["part", "mean ms", "p50 ms", "p90 ms"], rows))
    return out


def _ms(v: dict) -> list:
    return ["-" if v[k] is None else f"{v[k]:g}" for k in ("mean_ms", "p50_ms", "p90_ms")]
