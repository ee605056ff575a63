"""`mmscope demo`: the whole pipeline on the tiny model on this machine's CPU.

(Being built: for now it builds the tiny model and says what the demo will show.)
"""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="mmscope-demo", help="output directory (default ./mmscope-demo)")


def run(args) -> int:
    from mmscope import tiny_model

    path = tiny_model.build(tiny_model.default_dir())
    print(f"tiny model ready: {path}")
    print("not there yet: serving it with the plugin, the load, and the stage report")
    return 0
