"""The README's picture of the HTML report (docs/report.png): `mmscope demo` run into a fresh
folder, its report.html drawn by headless Chromium. `make screenshot` runs it.

Usage: python scripts/report_screenshot.py [--out docs/report.png] [--demo DIR]
--demo: draw the report of a demo already run into DIR instead of running one.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WINDOW = "1280,1700"  # the report's first screen: the stage tree, host against device, the steps


def fail(message: str) -> None:
    raise SystemExit(f"report_screenshot: {message}")


def run_demo(folder: Path) -> Path:
    done = subprocess.run([sys.executable, "-m", "mmscope.cli", "demo", "--out", str(folder)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        fail(f"mmscope demo failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    return folder / "report.html"


def draw(report: Path, out: Path, scratch: Path) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        fail("chromium is not on PATH (Debian: apt-get install chromium; scripts/setup.sh "
             "installs it as root)")
    done = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                           "--hide-scrollbars", "--no-first-run",
                           f"--user-data-dir={scratch / 'chromium'}", f"--window-size={WINDOW}",
                           "--virtual-time-budget=10000", f"--screenshot={out}",
                           report.as_uri()], capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not out.is_file():
        fail(f"chromium drew no {out}: {done.stderr.strip()[-300:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "report.png"))
    ap.add_argument("--demo", help="a folder `mmscope demo --out` wrote")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    if not out.parent.is_dir():
        fail(f"--out {out}: folder does not exist: {out.parent}")
    with tempfile.TemporaryDirectory(prefix="mmscope-screenshot-") as tmp:
        scratch = Path(tmp)
        if args.demo:
            report = Path(args.demo).resolve() / "report.html"
            if not report.is_file():
                fail(f"--demo {args.demo}: no report.html in it")
        else:
            report = run_demo(scratch / "demo")
        draw(report, out, scratch)
    print(f"report_screenshot: {os.path.relpath(out)} drawn from {report}")


if __name__ == "__main__":
    main()
