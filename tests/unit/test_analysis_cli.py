"""`mmscope analyze` and `mmscope compare` from the command line: outputs and bad inputs."""
from __future__ import annotations

import csv
import json
import os
import stat
import subprocess
import sys

import pytest

from tests.kit import nsys as F
from mmscope import cli, stages

NEEDED = {"name", "count", "total_ns", "mean_ns", "p50_ns", "p90_ns", "p99_ns", "max_ns"}


def mmscope(*args, env=None):
    return subprocess.run([sys.executable, "-m", "mmscope.cli", *args], capture_output=True,
                          text=True, env=env, timeout=120)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Analyses cached by these runs stay in the test's folder (subprocesses inherit it)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    return F.pipeline_file(tmp_path_factory.mktemp("cli") / "p.sqlite")


def test_json_output(profile):
    done = mmscope("analyze", profile, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert set(doc) >= {"tree", "stages", "checks", "steps", "cache_benefit", "per_step"}
    by = {s["name"]: s for s in doc["stages"]}
    assert all(NEEDED <= set(s) for s in doc["stages"])
    assert all(isinstance(s[k], int) for s in doc["stages"] for k in NEEDED - {"name"})
    assert (by[stages.VIT_FORWARD]["count"], by[stages.VIT_FORWARD]["total_ns"]) == (2, 1200)
    assert [set(c) >= {"name", "ok", "detail"} and c["ok"] for c in doc["checks"]] == [True] * 5
    assert doc["steps"]["pairs"] == 3
    assert doc["cache_benefit"]["compared_kind"] is None  # no kind with and without the encoder
    assert doc["profile"]["unclosed"] == 1 and len(doc["profile"]["processes"]) == 2
    assert {n["role"] for n in doc["tree"]} == {"API server", "engine + worker"}


def test_terminal_tree_flat_and_filter(profile, capsys):
    assert cli.main(["analyze", profile, "--filter", "vit|save"]) == 0
    out = capsys.readouterr().out
    tree = out.split("ok   ranges nest")[0]
    # the matching stages and the path down to them; nothing else
    assert f"├─ {stages.VIT_FORWARD}" in tree and f"└─ {stages.EC_SAVE}" in tree
    assert stages.PREPROCESS in tree and stages.GATHER_MM_EMBEDDINGS not in tree
    assert cli.main(["analyze", profile, "--filter", "vit|save", "--flat"]) == 0
    flat = capsys.readouterr().out.split("ok   ranges nest")[0]
    assert "stages (durations per range)" in flat and "├─" not in flat
    assert stages.VIT_FORWARD in flat and stages.PREPROCESS not in flat.replace(
        f"{stages.PREPROCESS} (", "")


def test_csv_and_html_files(profile, tmp_path, capsys):
    out_csv, out_html = tmp_path / "s.csv", tmp_path / "r.html"
    assert cli.main(["analyze", profile, "--csv", str(out_csv)]) == 0
    rows = list(csv.DictReader(out_csv.open()))
    vit = [r for r in rows if r["name"] == stages.VIT_FORWARD][0]
    assert (vit["count"], vit["total_ns"], vit["p50_ns"]) == ("2", "1200", "500")
    assert cli.main(["analyze", profile, "--html", str(out_html)]) == 0
    page = out_html.read_text()
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    # self-contained: nothing is fetched (the browser test opens it, tests/unit/test_analysis_html)
    assert "src=" not in page and "<link" not in page and "url(" not in page


def test_compare(profile, tmp_path, capsys):
    slower = tmp_path / "slow.sqlite"
    with F.NsysFile(slower) as f:
        f.vm = 1
        F.write_pipeline(f, stages)
        for a, b in ((0, 4000), (4000, 8000), (8000, 8900)):  # on another thread, before the end
            f.range(stages.VIT_FORWARD, a, b, pid=F.WORKER_PID, tid=300)
    done = mmscope("compare", profile, str(slower), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    vit = [s for s in doc["stages"] if s["name"] == stages.VIT_FORWARD][0]
    assert (vit["base"]["mean_ns"], vit["new"]["mean_ns"]) == (600, 2020)
    assert vit["delta_mean_ns"] == 1420 and vit["delta_mean_pct"] == 236.67
    assert vit["moved"] and doc["moved_most"] == [stages.VIT_FORWARD]
    assert cli.main(["compare", profile, str(slower)]) == 0
    out = capsys.readouterr().out
    assert "moved most: " + stages.VIT_FORWARD in out


def _bad_inputs(tmp, profile):
    truncated = tmp / "truncated.sqlite"
    data = open(profile, "rb").read()
    truncated.write_bytes(data[: len(data) // 3])
    (tmp / "random.sqlite").write_bytes(b"\x00\x01garbage" * 100)
    F.NsysFile(tmp / "nonvtx.sqlite", nvtx=False).close()
    (tmp / "notrace.json").write_text('{"hello": [1, 2, 3]}')
    (tmp / "broken.json").write_text('{"traceEvents": [')
    (tmp / "empty.json").write_text("")
    return {"missing": (str(tmp / "nope.sqlite"), "no such file"),
            "truncated": (str(truncated), "not a readable SQLite database"),
            "non-sqlite": (str(tmp / "random.sqlite"), "not a profile"),
            "no-nvtx": (str(tmp / "nonvtx.sqlite"), "without an NVTX_EVENTS table"),
            "not-a-trace": (str(tmp / "notrace.json"), "not a Chrome trace"),
            "broken-json": (str(tmp / "broken.json"), "not a readable Chrome trace JSON"),
            "empty": (str(tmp / "empty.json"), "empty file")}


def test_bad_inputs_exit_2_with_one_line(profile, tmp_path):
    for label, (path, message) in _bad_inputs(tmp_path, profile).items():
        done = mmscope("analyze", path)
        assert done.returncode == 2, (label, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("mmscope: error: "), (label, done.stderr)
        assert message in lines[0] and "Traceback" not in done.stderr, (label, lines)
    done = mmscope("compare", profile, str(tmp_path / "nope.sqlite"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1


def test_nsys_rep_without_and_with_nsys(profile, tmp_path):
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"not really a report")
    env = dict(os.environ, PATH=str(tmp_path / "bin"))
    done = mmscope("analyze", str(rep), env=env)
    assert done.returncode == 2 and "needs `nsys` on PATH" in done.stderr
    # A stand-in nsys that "exports" by copying the fixture where --output says.
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "nsys"
    fake.write_text(f"#!{sys.executable}\nimport shutil, sys\n"
                    f"shutil.copy({profile!r}, sys.argv[sys.argv.index('--output') + 1])\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    done = mmscope("analyze", str(rep), "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert "exporting" in done.stderr
    assert json.loads(done.stdout)["steps"]["pairs"] == 3


@pytest.mark.parametrize("command", ["analyze", "compare"])
@pytest.mark.parametrize("workers", ["0", "-3"])
def test_workers_below_one_is_a_one_line_error(profile, command, workers):
    paths = [profile] if command == "analyze" else [profile, profile]
    done = mmscope(command, "--workers", workers, *paths)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0] == f"mmscope: error: --workers: needs 1 or more threads, not {workers}"


def test_workers_read_the_same_numbers(profile):
    one = json.loads(mmscope("analyze", "--json", "--no-cache", "--workers", "1", profile).stdout)
    two = json.loads(mmscope("analyze", "--json", "--no-cache", "--workers", "2", profile).stdout)
    assert one == two


def test_json_through_a_pipe_that_closes_early(profile):
    """`mmscope analyze --json FILE | head -1`: the JSON goes through stdout, and a reader that
    leaves early ends the command without a traceback."""
    cmd = f"{sys.executable} -m mmscope.cli analyze --json --no-cache {profile} | head -1"
    done = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True)
    assert done.stdout.strip() == "{"
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr


def _on_a_terminal(args: list[str], env: dict) -> str:
    """A command's stderr when it is a terminal (a pseudo-terminal here), stdout piped away."""
    import pty

    main_fd, side_fd = pty.openpty()
    try:
        done = subprocess.run([sys.executable, "-m", "mmscope.cli", *args],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=side_fd,
                              env=env, timeout=300)
    finally:
        os.close(side_fd)
    out = b""
    while True:
        try:
            chunk = os.read(main_fd, 4096)
        except OSError:  # the terminal's other side is closed: all is read
            break
        if not chunk:
            break
        out += chunk
    os.close(main_fd)
    assert done.returncode == 0, out
    return out.decode()


def test_a_first_analysis_says_it_compiles_on_a_terminal(profile, tmp_path):
    """With numba's cache empty (its own folder here), the run on a terminal says once that it
    compiles the analyzer's passes; the next run loads them and says nothing more."""
    from mmscope.analyze.commands.analyze import COMPILING

    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    first = _on_a_terminal(["analyze", "--no-cache", profile], env)
    assert first.count(COMPILING) == 1, first
    assert COMPILING not in _on_a_terminal(["analyze", "--no-cache", profile], env)


def test_piped_stderr_is_not_told_of_compiling(monkeypatch):
    """Piped (scripts, CI logs), a compile says nothing: stderr keeps only what went wrong."""
    import io

    from numba import njit

    from mmscope.analyze.commands.analyze import compiling_said

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with compiling_said():
        assert njit(lambda x: x + 1)(1) == 2  # compiled here, never cached
    assert sys.stderr.getvalue() == ""
