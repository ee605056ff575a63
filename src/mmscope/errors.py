"""The one exception type that the command line turns into a one-line error, and the check that
an output file can be made, run before the work that fills it.

Raise `UserError` for bad input (missing file, wrong format, unreachable server); never a traceback.
"""
from __future__ import annotations

import os
import tempfile


class UserError(Exception):
    """A problem the user can fix; printed as `mmscope: error: <message>` with exit status 2."""


def check_output_file(path: str, option: str, formats: tuple[str, ...] = ()) -> None:
    """UserError unless a file can be created at `path` (its folder exists and takes a new file)
    and, where `formats` are given, its extension is one of them. A real file is created in the
    folder and removed: permission bits do not tell (root writes anywhere, /proc takes nothing)."""
    if os.path.isdir(path):
        raise UserError(f"{option} {path}: is a directory, not a file")
    if formats:
        ext = os.path.splitext(path)[1].lower().lstrip(".")
        if ext not in formats:
            raise UserError(f"{option} {path}: the name must end in one of "
                            f"{', '.join('.' + f for f in formats)}")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise UserError(f"{option} {path}: cannot create a file in {folder} "
                        f"({e.strerror or e})") from None
