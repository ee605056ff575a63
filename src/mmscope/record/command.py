"""`mmscope record [-o FILE] -- COMMAND [ARGS...]`: runs a command with NVTX capture injected.

All its processes record into a spool folder, which then becomes one nsys-schema SQLite file.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time

from mmscope import large_arrays
from mmscope.errors import UserError

DEFAULT_OUTPUT = "mmscope-record.sqlite"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
MAX_LINGER_S = 3600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", default=DEFAULT_OUTPUT,
                        help=f"SQLite file to write (default: {DEFAULT_OUTPUT})")
    parser.add_argument("-f", "--force", action="store_true",
                        help="overwrite the output file if it exists (otherwise that is an error, "
                             "reported before the command runs)")
    parser.add_argument("--spool-dir", metavar="DIR",
                        help="an existing folder in which the per-process spool files get a "
                             "temporary folder (default: the output's folder)")
    parser.add_argument("--keep-spool", action="store_true", help="keep the spool files afterwards")
    parser.add_argument("--linger", default="5", metavar="SECONDS",
                        help="after the command exits, how long to wait for processes it left in "
                             f"its process group, 0 to {MAX_LINGER_S:g} (default: 5)")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]",
                        help="the command to run")
    parser.error = _one_line_error


def _one_line_error(message: str) -> None:
    """Usage errors in the same one line as every other error of the command."""
    print(f"mmscope: error: {message} (see mmscope record --help)", file=sys.stderr)
    sys.exit(2)


def _linger_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise UserError(f"--linger takes a number of seconds, not {text!r}") from None
    if not 0 <= seconds <= MAX_LINGER_S:  # also false for nan
        raise UserError(f"--linger must be between 0 and {MAX_LINGER_S:g} seconds, not {text}")
    return seconds


def run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UserError("no command given: mmscope record [-o FILE] -- COMMAND [ARGS...]")
    linger = _linger_seconds(args.linger)
    executable = _resolve(command[0])
    output = _check_output(args.output, args.force)
    if args.spool_dir is not None:
        _check_spool_dir(args.spool_dir)
    from mmscope.record import native_library

    library = native_library("_nvtx_inject")
    if library is None:
        raise UserError("the NVTX injection library is not built; reinstall mmscope with a C compiler")
    spool = _make_spool(args.spool_dir, output)
    try:
        return _record(command, executable, library, spool, output, linger)
    finally:
        if not args.keep_spool:
            shutil.rmtree(spool, ignore_errors=True)


def _resolve(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise UserError(f"command not found: {name}")
    return path


def _check_output(path: str, force: bool) -> str:
    path = os.path.abspath(path)
    if os.path.isdir(path):
        raise UserError(f"{path} is a folder; give a file name with -o")
    if not os.path.isdir(os.path.dirname(path)):
        raise UserError(f"folder does not exist: {os.path.dirname(path)}")
    if os.path.exists(path) and not force:
        raise UserError(f"{path} exists; use --force to overwrite it")
    return path


def _check_spool_dir(path: str) -> None:
    """Like -o's folder: one that exists; mmscope makes no folders above what it was given."""
    if not os.path.exists(path):
        raise UserError(f"--spool-dir {path}: folder does not exist")
    if not os.path.isdir(path):
        raise UserError(f"--spool-dir {path}: is not a folder")


def _make_spool(spool_dir: str | None, output: str) -> str:
    import tempfile

    parent = spool_dir or os.path.dirname(output)
    try:
        return tempfile.mkdtemp(prefix=".mmscope-spool-", dir=parent)
    except OSError as e:
        raise UserError(f"cannot create a spool folder in {parent}: {e.strerror}") from None


def _record(command, executable, library, spool, output, linger) -> int:
    env = dict(os.environ, NVTX_INJECTION64_PATH=library, MMSCOPE_RECORD_DIR=spool)
    large_arrays.plain_pages()  # the writer's, after the command's environment is taken
    from mmscope.record.writer import Session, clock_pair, write_export

    ticks, ns, tsc = clock_pair()
    session = Session(start_ns=ns, utc_epoch_ns=time.time_ns(), pairs=[(ticks, ns)], tsc=tsc,
                      command=[executable, *command[1:]])
    returncode = _run_child(command, executable, env, linger)
    ticks, ns, _ = clock_pair()
    session.pairs.append((ticks, ns))
    session.end_ns = ns
    try:
        summary = write_export(spool, output, session)
    except OSError as e:
        raise UserError(f"cannot write {output}: {e}") from None
    print(f"mmscope record: {_n(summary.events, 'event', 'events')}, {_n(summary.processes, 'process', 'processes')}, "
          f"{_n(summary.threads, 'thread', 'threads')} -> {summary.path}", file=sys.stderr)
    if summary.events == 0:
        print("mmscope record: no NVTX events were recorded (does the command call NVTX?)", file=sys.stderr)
    return returncode


def _n(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def _run_child(command, executable, env, linger) -> int:
    """Runs the command in its own process group, which gets the terminal and every signal that
    reaches the recorder, so Ctrl-C stops the whole command and the recorder still writes."""
    import subprocess

    tty = _foreground_tty()
    try:
        child = subprocess.Popen([executable, *command[1:]], env=env,
                                 preexec_fn=lambda: _child_setup(tty))
    except OSError as e:
        raise UserError(f"cannot run {command[0]}: {e.strerror}") from None
    previous = {sig: signal.signal(sig, lambda s, _f: _forward(child.pid, s)) for sig in FORWARDED}
    try:
        returncode = child.wait()
        _linger(child.pid, linger)
    finally:
        _take_back_tty(tty)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - returncode if returncode < 0 else returncode


def _foreground_tty() -> int | None:
    try:
        return 0 if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp() else None
    except OSError:
        return None


def _child_setup(tty: int | None) -> None:
    os.setpgid(0, 0)
    if tty is not None:
        _set_foreground(tty, os.getpgrp())


def _set_foreground(tty: int, pgrp: int) -> None:
    # a background group that changes the terminal's foreground gets SIGTTOU unless it ignores it
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(tty, pgrp)
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, old)


def _take_back_tty(tty: int | None) -> None:
    if tty is not None:
        _set_foreground(tty, os.getpgrp())


def _forward(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _linger(pgid: int, seconds: float) -> None:
    """Waits a little for processes still in the command's group (workers that outlive their
    parent); their records up to the moment of writing are kept in any case."""
    deadline = time.monotonic() + seconds
    while _group_alive(pgid):
        if time.monotonic() > deadline:
            print(f"mmscope record: processes of the command are still running after {seconds:g} s;"
                  " writing what they recorded so far", file=sys.stderr)
            return
        time.sleep(0.02)


def _group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process is in the group; zombies count as gone because a
    container's init may never reap them."""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        try:
            os.killpg(pgid, 0)
            return True
        except OSError:
            return False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False
