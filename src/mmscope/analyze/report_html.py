"""The self-contained HTML report: tables plus plots embedded as base64 PNG (matplotlib, Agg).

Plots: stage breakdown, forward time against batch tokens, encoder time per preprocess step.
"""
from __future__ import annotations

import base64
import html
import io

from mmscope import stages
from mmscope.analyze.report import Analysis, fmt_ns

TOP_STAGES = 25


def write_html(analysis: Analysis, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(analysis))


def render(analysis: Analysis) -> str:
    import matplotlib

    matplotlib.use("Agg")
    info = analysis.profile
    parts = [f"<h1>mmscope analyze: {html.escape(info['path'])}</h1>",
             f"<p>{html.escape(info['format'])}: {info['ranges']} ranges, {info['threads']} "
             f"threads, {info['processes']} processes, span {fmt_ns(info['span_ns'])}</p>",
             "<h2>Stages</h2>", _img(_plot_stages(analysis.stages)), _stage_table(analysis.stages),
             "<h2>Checks</h2>", _checks(analysis.checks),
             "<h2>Forward time against batch shape</h2>",
             _img(_plot_forward(analysis.plots.get("forward"))),
             "<h2>Encoder time per step</h2>", _img(_plot_encoder(analysis))]
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>mmscope report</title>"
            f"<style>{_CSS}</style></head><body>{''.join(parts)}</body></html>\n")


_CSS = ("body{font-family:sans-serif;margin:2em;max-width:1200px}"
        "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
        "padding:3px 8px;text-align:right}td:first-child,th:first-child{text-align:left}"
        ".ok{color:#080}.fail{color:#b00;font-weight:bold}img{max-width:100%}")


def _img(fig) -> str:
    import matplotlib.pyplot as plt

    if fig is None:
        return "<p>(no data for this plot)</p>"
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode()
    return f"<img alt='plot' src='data:image/png;base64,{data}'>"


def _stage_table(rows: list[dict]) -> str:
    head = "".join(f"<th>{h}</th>" for h in
                   ("stage", "count", "total", "mean", "p50", "p90", "p99", "max", "of parent"))
    body = []
    for r in rows:
        share = ("" if r["share_of_parent"] is None else
                 f"{100 * r['share_of_parent']:.1f}% of {html.escape(str(r['parent']))}")
        cells = [html.escape(r["name"]), str(r["count"])] + [
            fmt_ns(r[k]) for k in ("total_ns", "mean_ns", "p50_ns", "p90_ns", "p99_ns", "max_ns")]
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells + [share]) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _checks(rows: list[dict]) -> str:
    items = [f"<li><span class='{'ok' if c['ok'] else 'fail'}'>{'ok' if c['ok'] else 'FAIL'}"
             f"</span> {html.escape(c['name'])}: {html.escape(c['detail'])}</li>" for c in rows]
    return f"<ul>{''.join(items)}</ul>"


def _plot_stages(rows: list[dict]):
    import matplotlib.pyplot as plt

    rows = rows[:TOP_STAGES]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(9, 0.3 * len(rows) + 1))
    names = [r["name"] for r in rows][::-1]
    totals = [r["total_ns"] / 1e6 for r in rows][::-1]
    ax.barh(names, totals, color="#4477aa")
    ax.set_xlabel("total time (ms)")
    ax.set_title("time per stage")
    return fig


def _plot_forward(points: dict | None):
    import matplotlib.pyplot as plt
    import numpy as np

    from mmscope.analyze import steps

    if not points:
        return None
    total = np.array(points["total"], np.int64)
    fwd = np.array(points["forward_ns"], np.int64) / 1e3
    kinds = steps.kind_of(np.array(points["prefill"], np.int64),
                          np.array(points["decode"], np.int64))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for kind, color in (("prefill", "#cc6677"), ("decode", "#4477aa"), ("mixed", "#228833"),
                        ("idle", "#999999")):
        sel = kinds == kind
        if sel.any():
            ax.scatter(total[sel], fwd[sel], s=6, alpha=0.5, color=color, label=kind)
    ax.set_xlabel("tokens in the step (prefill + decode)")
    ax.set_ylabel("forward time (µs)")
    ax.legend()
    return fig


def _plot_encoder(analysis: Analysis):
    import matplotlib.pyplot as plt
    import numpy as np

    points = analysis.plots.get("encoder")
    if not points:
        return None
    idx = np.array(points["step"], np.int64)
    pre_us = np.array(points["preprocess_ns"], np.int64) / 1e3
    enc = np.array(points["encoder_ns"], np.int64)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.scatter(idx, pre_us, s=5, alpha=0.4, color="#999999", label=stages.PREPROCESS)
    ran = enc > 0
    ax.scatter(idx[ran], enc[ran] / 1e3, s=6, alpha=0.6, color="#cc6677",
               label=f"{stages.VIT_FORWARD} inside it")
    ax.set_xlabel(f"step ('{stages.PREPROCESS}' range, time order)")
    ax.set_ylabel("time (µs)")
    ax.legend()
    return fig
