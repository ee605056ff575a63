"""`mmscope demo`: the whole product on a tiny built-in model on this machine's CPU.

Real vLLM with the plugin, NVTX recorded without nsys, then the stage report and the cache counters.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from mmscope.demo.workload import METRICS_PAGE  # light: the workload imports vLLM in main()
from mmscope.errors import UserError


PLURALS = {"image": "images", "video": "videos", "audio": "audio clips"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from mmscope.demo.tiny_model import ARCHS, DEFAULT_ARCH

    p.add_argument("--out", default="mmscope-demo",
                   help="folder for the trace, profile, report and logs (default ./mmscope-demo)")
    p.add_argument("--arch", choices=sorted(ARCHS), default=DEFAULT_ARCH,
                   help=f"tiny model family to run (default {DEFAULT_ARCH})")


def run(args) -> int:
    from rich.console import Console

    console = Console(stderr=True)
    out = _out_folder(args.out)
    t0 = time.monotonic()
    with console.status("building the tiny model (first run only)") as status:
        model = _tiny_model(args.arch)
        profile = _run_workload(out, model, args.arch, status)
        status.update("analysing the recorded ranges")
        analysis = _analyse(profile, os.path.join(out, "report.html"),
                            os.path.join(out, METRICS_PAGE))
    _report(out, profile, analysis, time.monotonic() - t0)
    return 0


def _out_folder(path: str) -> str:
    """The folder the user named, made if absent; never the folders above it."""
    out = os.path.abspath(path)
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f"--out {out} exists and is not a folder")
    if not os.path.exists(os.path.dirname(out)):
        raise UserError(f"--out {out}: folder does not exist: {os.path.dirname(out)}")
    try:
        os.makedirs(os.path.join(out, "traces"), exist_ok=True)
    except OSError as e:
        raise UserError(f"--out {out}: cannot make the folder ({e.strerror})") from None
    return out


def _tiny_model(arch: str) -> str:
    from mmscope.demo import tiny_model
    return tiny_model.build(tiny_model.default_dir(arch), arch=arch)


def _recorder_available() -> bool:
    from mmscope.record import native_library
    return native_library("_nvtx_inject") is not None


def _run_workload(out: str, model: str, arch: str, status) -> str:
    """The workload in a child process: under `mmscope record` (NVTX -> nsys-schema SQLite) when
    the recorder is built, always with the chrome backend too (a Perfetto-ready trace), the access
    log and the opt-in TTFT split on. The tiny model's environment reaches every process of it,
    vLLM's model inspection subprocess too."""
    from mmscope.demo import environment

    env = dict(os.environ, MMSCOPE_TRACE_DIR=os.path.join(out, "traces"), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
               MMSCOPE_ACCESS_LOG=os.path.join(out, "access.log"), MMSCOPE_TTFT_PARTS="1",
               **environment.server_environment(os.environ.get("PYTHONPATH")))
    for stale in ("access.log", "summary.json", METRICS_PAGE):
        if os.path.exists(os.path.join(out, stale)):
            os.remove(os.path.join(out, stale))
    for old in os.listdir(os.path.join(out, "traces")):
        os.remove(os.path.join(out, "traces", old))
    workload = [sys.executable, "-m", "mmscope.demo.workload", out, model, arch]
    if _recorder_available():
        profile = os.path.join(out, "profile.sqlite")
        env["MMSCOPE_TRACE"] = "nvtx,chrome"
        cmd = [sys.executable, "-m", "mmscope.cli", "record", "--force", "-o", profile, "--",
               *workload]
    else:
        profile = None
        env["MMSCOPE_TRACE"] = "chrome"
        cmd = workload
    log_path = os.path.join(out, "vllm.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
        for line in proc.stdout:
            log.write(line)
            if line.startswith("PROGRESS "):
                status.update(line[len("PROGRESS "):].strip())
        if proc.wait() != 0:
            raise UserError(f"the demo workload failed (status {proc.returncode}); see {log_path}")
    if profile is None:
        traces = [f for f in os.listdir(os.path.join(out, "traces")) if f.endswith(".json")]
        profile = os.path.join(out, "traces", traces[0])
    return profile


def _analyse(profile: str, html: str, metrics_page: str):
    """The stage report, and the HTML report with the engine's counters from its /metrics page
    (the terminal prints them in the demo's own table)."""
    import dataclasses

    from mmscope.analyze import load
    from mmscope.analyze.readers import scrape
    from mmscope.analyze.report.analysis import analyze
    from mmscope.analyze.report.html import write_html

    analysis = analyze(profile, load(profile, quiet=True))
    write_html(dataclasses.replace(analysis, cache=scrape.read(metrics_page)), html)
    return analysis


def _report(out: str, profile: str, analysis, elapsed: float) -> None:
    from rich.table import Table

    from mmscope import vocabulary
    from mmscope.analyze.report.terminal import print_terminal
    from mmscope.console import report_console
    from mmscope.load.observed import series

    console = report_console()
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    console.rule("[bold]mmscope demo: where the time of the multimodal pipeline goes")
    print_terminal(analysis, console)
    console.rule("[bold]encoder cache (vllm:encoder_cache_* on /metrics)")
    c = summary["counters"]
    q, h = c.get(series.QUERIES, 0), c.get(series.HITS, 0)
    table = Table("counter", "value", "meaning")
    rows = [
        ("queries", q, "multimodal items committed for scheduled requests"),
        ("hits", h, "encoder output reused"),
        ("misses", c.get(series.MISSES, 0), "encoder runs (one per computed item)"),
        ("  hits from cache", c.get(series.by_source(vocabulary.LOCAL), 0),
         "resident from an earlier request"),
        ("  hits in step", c.get(series.by_source(vocabulary.IN_STEP), 0),
         "computed by another request (or item) of the same step"),
        ("deferrals", c.get(series.DEFERRALS, 0), "items postponed for budget or space"),
        ("evictions", c.get(series.EVICTIONS, 0), "entries evicted to make room"),
    ]
    items = summary["items"]
    if len(items) > 1:
        rows[1:1] = [(f"  queries ({m})", c.get(f"{series.QUERIES}_by_modality{{modality={m}}}", 0),
                      f"{m} items") for m in items]
    for name, value, meaning in rows:
        table.add_row(name, f"{value:.0f}", meaning)
    console.print(table)
    rate = 100 * h / q if q else 0.0
    counted = " and ".join(f"{n} {PLURALS[m]}" for m, n in items.items())
    console.print(f"encoder cache hit rate: [bold]{rate:.1f}%[/bold] over {counted} "
                  f"in {summary['requests']} requests")
    _layers_table(console, summary.get("layers"))
    _ttft_table(console, summary.get("ttft_parts") or {})
    s = summary["steps"]
    console.print(f"step_tokens: {s['steps']} steps, {s['prefill_tokens']} prefill and "
                  f"{s['decode_tokens']} decode tokens")
    if summary.get("stats_line"):
        console.print("vLLM stats line:", summary["stats_line"].split("Engine 000: ")[-1],
                      markup=False, highlight=False)
    console.rule("[bold]files")
    traces = os.path.join(out, "traces")
    for label, path in [("NVTX profile (nsys export schema)", profile),
                        ("Chrome/Perfetto trace", os.path.join(traces, sorted(os.listdir(traces))[0])),
                        ("HTML report", os.path.join(out, "report.html")),
                        ("/metrics page (analyze --metrics)", os.path.join(out, METRICS_PAGE)),
                        ("encoder-cache access log", os.path.join(out, "access.log")),
                        ("vLLM log", os.path.join(out, "vllm.log"))]:
        console.print(f"{label:36} {_short(path)}", highlight=False)
    console.print(f"done in {elapsed:.0f} s. Next: mmscope analyze {_short(profile)} --metrics "
                  f"{_short(os.path.join(out, METRICS_PAGE))}; "
                  "open the trace in https://ui.perfetto.dev", highlight=False)


def _layers_table(console, ways: dict | None) -> None:
    """Each item once, by the cache layer that served it, and the seconds each layer saved."""
    from rich.table import Table

    from mmscope.expose import layers

    if not ways:
        return
    console.rule("[bold]where items were served from (vllm:mm_items_total, "
                 "vllm:mm_work_saved_seconds_total)")
    table = Table("layer", "items", "work saved (s)")
    for name, items, saved in layers.rows(ways):
        table.add_row(name, str(items), "" if saved is None else f"{saved:.4f}")
    console.print(table)


def _ttft_table(console, split: dict) -> None:
    """Mean time to first token by part, for requests whose items hit and those that missed."""
    from rich.table import Table

    from mmscope import stages

    if not split:
        return
    console.rule("[bold]time to first token by part (vllm:request_ttft_part_seconds), mean ms")
    table = Table("encoder cache", "requests", *stages.TTFT_PARTS)
    for outcome, parts in split.items():
        table.add_row(outcome, f"{parts['requests']:.0f}",
                      *(f"{parts.get(p, 0):.1f}" for p in stages.TTFT_PARTS))
    console.print(table)


def _short(path: str) -> str:
    rel = os.path.relpath(path)
    return rel if len(rel) < len(path) else path
