"""`mmscope analyze PROFILE`: the stage tree, checks, step join and cache benefit of a profile.

Reads nsys SQLite exports, .nsys-rep reports (through nsys) and Chrome traces; heavy imports wait,
and a second run on an unchanged file answers from the analysis cache without them.
"""
from __future__ import annotations

import argparse
import functools
import json
import re
import sys

from mmscope import large_arrays
from mmscope.errors import UserError, check_output_file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", help="nsys SQLite export, .nsys-rep, Chrome trace JSON(.gz), or a folder of "
                        "Chrome traces (MMSCOPE_TRACE_DIR)")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    out.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")
    out.add_argument("--csv", metavar="FILE", help="write the per-stage table as CSV")
    parser.add_argument("--flat", action="store_true",
                        help="one row per stage instead of the stage tree per process role")
    parser.add_argument("--metrics", metavar="PAGE",
                        help="the encoder cache's counters and time to first token by part from "
                        "a vLLM /metrics page: a saved file or the server's URL")
    parser.add_argument("--timeout", type=_timeout, default=10.0, metavar="SECONDS",
                        help="how long --metrics waits for a server's answer (default: 10)")
    add_stage_options(parser)
    parser.add_argument("--no-cache", action="store_true",
                        help="analyze the file even if the analysis cache holds it (and do not "
                        "store the result)")


def add_stage_options(parser: argparse.ArgumentParser) -> None:
    """The options of which stages a profile has and how it is read (analyze and compare)."""
    parser.add_argument("--filter", metavar="REGEX", help="only stages whose name matches")
    parser.add_argument("--raw-names", action="store_true",
                        help="one stage per range name as written (default: names that differ "
                        "only in numbers, such as torch's `aten::to, seq = 12, op_id = 99`, are "
                        "one stage, their family)")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="rowid ranges of an SQLite file read at once, one thread each "
                        "(default: 2)")


def _timeout(text: str) -> float:
    from mmscope.analyze.readers.scrape import timeout

    return timeout(text)


def check_workers(workers: int | None) -> None:
    if workers is not None and workers < 1:
        raise UserError(f"--workers: needs 1 or more threads, not {workers}")


def check_regex(pattern: str | None) -> None:
    if pattern is None:
        return
    try:
        re.compile(pattern)
    except re.error as e:
        raise UserError(f"--filter: bad regular expression ({e})") from None


def run(args) -> int:
    from mmscope.analyze.commands import cache
    from mmscope.analyze.report.analysis import Analysis

    check_regex(args.filter)
    check_workers(args.workers)
    for path, option in ((args.html, "--html"), (args.csv, "--csv")):
        if path is not None:  # before the work, as every command's output
            check_output_file(path, option)
    scraped = None
    if args.metrics:
        from mmscope.analyze.readers import scrape

        scraped = scrape.read(args.metrics, args.timeout)
    # The key first: a warm run answers before numpy or polars are imported.
    key = None if args.no_cache else cache.key_for(args.profile, args.filter, args.raw_names)
    doc = cache.read(key)
    if doc is not None:
        analysis = Analysis.from_doc(args.profile, doc)
    else:
        analysis = compute(args.profile, args.filter, args.workers, args.raw_names)
        cache.write(key, analysis.doc())
    analysis.cache = scraped
    if args.json:
        json.dump(analysis.to_json(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif args.html:
        from mmscope.analyze.report.html import write_html

        _write(args.html, lambda: write_html(analysis, args.html))
        print(f"wrote {args.html}", file=sys.stderr)
    elif args.csv:
        from mmscope.analyze.report.terminal import write_csv

        _write(args.csv, lambda: write_csv(analysis, args.csv))
        print(f"wrote {args.csv}", file=sys.stderr)
    else:
        from mmscope.analyze.report.terminal import print_terminal

        print_terminal(analysis, flat=args.flat)
    return 0


def compute(path: str, name_filter: str | None, workers: int | None, raw_names: bool = False):
    """Load and analyze the profile in this process (the cache's miss road)."""
    large_arrays.plain_pages()
    large_arrays.return_freed_memory()
    from mmscope.analyze import load
    from mmscope.analyze.report.analysis import analyze

    with compiling_said():
        return analyze(path, load(path, workers=workers), name_filter, raw_names)


def _write(path: str, write) -> None:
    try:
        write()
    except OSError as e:
        raise UserError(f"{path}: cannot write ({e.strerror})") from None


COMPILING = ("mmscope: compiling the analyzer's passes for this machine (once, about 10 s; later "
             "runs load them)")


def compiling_said():
    """On a terminal, one line on stderr when numba compiles the analyzer's passes (through its
    event API), once a process: a machine's first analysis, or the first after an upgrade, takes
    that long once and would otherwise sit silent. Piped output stays as it was."""
    import contextlib

    if not sys.stderr.isatty():
        return contextlib.nullcontext()
    from numba.core import event

    return event.install_listener("numba:compile", _compiling_listener())


@functools.cache
def _compiling_listener():
    from numba.core import event

    class Said(event.Listener):
        said = False

        def on_start(self, ev) -> None:  # numba compiles under its lock: one thread at a time
            if not self.said:
                self.said = True
                print(COMPILING, file=sys.stderr, flush=True)

        def on_end(self, ev) -> None:
            pass

    return Said()
