"""The `mmscope` command line: one subcommand per module, imported only when used.

Each command module exposes `add_arguments(parser)` and `run(args) -> int`.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import signal
import sys

from mmscope import __version__
from mmscope.errors import UserError

# name -> (module, one-line help). Modules are imported lazily so `mmscope --help` stays fast.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("mmscope.demo.command", "run the whole pipeline on a tiny built-in model on the CPU"),
    "tiny-model": ("mmscope.demo.tiny_model",
                   "build a tiny vision-language model directory that vLLM serves"),
    "doctor": ("mmscope.doctor.command", "check every vLLM hook against the installed vLLM"),
    "analyze": ("mmscope.analyze.commands.analyze",
                "per-stage table, checks and step join of a profile"),
    "compare": ("mmscope.analyze.commands.compare", "per-stage deltas between two profiles"),
    "record": ("mmscope.record.command", "capture NVTX ranges of a command without Nsight Systems"),
    "load": ("mmscope.load.command",
             "verify the encoder cache under sweep load against a live server"),
    "cache-size": ("mmscope.cache_size.command",
                   "encoder-cache hit rate against capacity, from an access log"),
}


def _available() -> dict[str, tuple[str, str]]:
    found = {}
    for name, (module, help_) in COMMANDS.items():
        try:
            if importlib.util.find_spec(module) is not None:
                found[name] = (module, help_)
        except ModuleNotFoundError:  # its package is not part of this installation
            pass
    return found


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `command`'s module is imported (all of them without one), so that a warm
    `mmscope analyze` loads nothing of the other commands."""
    parser = argparse.ArgumentParser(
        prog="mmscope",
        description="Observability for the multimodal pipeline of vLLM.")
    parser.add_argument("--version", action="version", version=f"mmscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    available = _available()
    for name, (module, help_) in available.items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(_module=module)
        if command is None or command == name or command not in available:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(next((a for a in argv if not a.startswith("-")), None))
    args = parser.parse_args(argv)
    if not getattr(args, "_module", None):
        parser.print_help()
        return 2
    try:
        status = int(importlib.import_module(args._module).run(args) or 0)
        sys.stdout.flush()  # inside the try: a reader that left early is seen here, not at exit
        return status
    except UserError as e:
        print(f"mmscope: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _reader_left()
    except KeyboardInterrupt:
        print("mmscope: interrupted", file=sys.stderr)
        return 130


def _reader_left() -> int:
    """`mmscope ... | head`: the reader closed the pipe. Quiet, like a tool killed by SIGPIPE;
    stdout points at devnull so the interpreter's last flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
