"""`mmscope analyze PROFILE`: the per-stage table, checks, step join and cache benefit of a profile.

Reads nsys SQLite exports, .nsys-rep reports (through nsys) and Chrome traces; heavy imports wait.
"""
from __future__ import annotations

import argparse
import json
import re
import sys

from mmscope.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", help="nsys SQLite export, .nsys-rep, Chrome trace JSON(.gz), or a folder of "
                        "Chrome traces (MMSCOPE_TRACE_DIR)")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    out.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")
    out.add_argument("--csv", metavar="FILE", help="write the per-stage table as CSV")
    parser.add_argument("--filter", metavar="REGEX", help="only stages whose name matches")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="read an SQLite file through SQLite on N processes (default: read "
                        "its pages directly; SQLite on the free cores where that cannot)")


def check_regex(pattern: str | None) -> None:
    if pattern is None:
        return
    try:
        re.compile(pattern)
    except re.error as e:
        raise UserError(f"--filter: bad regular expression ({e})") from None


def run(args) -> int:
    from mmscope.analysis import load
    from mmscope.analysis.report import analyze, print_terminal, write_csv

    check_regex(args.filter)
    table = load(args.profile, workers=args.workers)
    analysis = analyze(args.profile, table, args.filter)
    if args.json:
        json.dump(analysis.to_json(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif args.html:
        from mmscope.analysis.report_html import write_html

        _write(args.html, lambda: write_html(analysis, args.html))
        print(f"wrote {args.html}", file=sys.stderr)
    elif args.csv:
        _write(args.csv, lambda: write_csv(analysis, args.csv))
        print(f"wrote {args.csv}", file=sys.stderr)
    else:
        print_terminal(analysis)
    return 0


def _write(path: str, write) -> None:
    try:
        write()
    except OSError as e:
        raise UserError(f"{path}: cannot write ({e.strerror})") from None
