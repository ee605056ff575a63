"""Running mmscope's commands from tests: the one-line error every bad input must give."""
from __future__ import annotations

import subprocess


def one_line_error(done: subprocess.CompletedProcess) -> str:
    """The error line of a command that refused its input: exit 2, nothing on stdout, one line
    `mmscope: error: ...` on stderr and no traceback."""
    assert done.returncode == 2 and done.stdout == ""
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("mmscope: error: ")
    return done.stderr.strip()
