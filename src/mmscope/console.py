"""The console the commands print their reports to: as wide as the terminal, or PIPED_WIDTH
columns where the output is piped (Rich's default 80 would cut the tables' names).
"""
from __future__ import annotations

import sys

PIPED_WIDTH = 160


def report_console(**options):
    from rich.console import Console

    return Console(**options) if sys.stdout.isatty() else Console(width=PIPED_WIDTH, **options)
