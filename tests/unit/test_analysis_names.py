"""Names as real profiles write them: printed as written (brackets are no markup), numbered names
in families (torch's emit_nvtx), and malformed events skipped and said, never a 0 ns range."""
from __future__ import annotations

import gzip
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from mmscope.analyze import load
from mmscope.analyze.commands.compare import compare
from mmscope.analyze.report.analysis import analyze, stage_stats
from mmscope.analyze.report.terminal import print_terminal
from tests.kit import nsys as F

DATA = Path(__file__).parent.parent / "data"
ALEXNET = DATA / "torch" / "hta-alexnet-critical-path.json.gz"
MFU = {k: DATA / "nsys" / f"nsys-ai-mfu-2gpu-{k}.sqlite.gz" for k in ("before", "after")}


@pytest.fixture(scope="module")
def mfu(tmp_path_factory) -> dict[str, str]:
    """The nsys-ai exports, unpacked."""
    out = {}
    for key, packed in MFU.items():
        path = tmp_path_factory.mktemp("mfu") / f"{key}.sqlite"
        with gzip.open(packed) as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
        out[key] = str(path)
    return out


def terminal(analysis, flat: bool) -> str:
    out = io.StringIO()
    print_terminal(analysis, Console(file=out, width=400), flat=flat)
    return out.getvalue()


@pytest.mark.parametrize("flat", [False, True], ids=["tree", "flat"])
def test_bracketed_names_print_as_written(flat):
    analysis = analyze(str(ALEXNET), load(str(ALEXNET)))
    shown = terminal(analysis, flat)
    # The tree leaves out the nodes under 0.5% of the time (clear_cache): the flat table not.
    for name in ("[param|cuda]", "[param|pytorch.model.alex_net|0|0|0]",
                 "[param|clear_cache]")[:3 if flat else 2]:
        assert name in shown, shown
    assert all(s["name"].startswith("[param|") for s in analysis.stages)


def test_a_name_like_markup_is_no_markup_in_the_terminal(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"ph": "X", "name": "[bold red]not bold[/bold red]", "ts": 0,
                                 "dur": 5, "pid": 1, "tid": 1}]))
    assert "[bold red]not bold[/bold red]" in terminal(analyze(str(path), load(str(path))), True)


def test_emit_nvtx_names_are_families(mfu):
    analysis = analyze(mfu["before"], load(mfu["before"]))
    by = {s["name"]: s for s in analysis.stages}
    # 19,118 ranges under 18,499 names of 71 shapes: 71 stages, every range counted once.
    assert len(analysis.stages) == 71
    assert sum(s["count"] for s in analysis.stages) == 19118
    to = by["aten::to, seq = <n>, op_id = <n>"]
    assert to["family"] == {"pattern": "aten::to, seq = <n>, op_id = <n>",
                            "names": to["family"]["names"]}
    assert 1 < to["family"]["names"] <= to["count"]
    assert sum(s["family"]["names"] if s["family"] else 1 for s in analysis.stages) == 18499
    shown = terminal(analysis, True)
    assert f"({to['family']['names']} names)" in shown


def test_raw_names_keep_one_stage_per_name(mfu):
    rows = stage_stats(load(mfu["before"]), raw_names=True)
    assert len(rows) == 18499 and all(r["family"] is None for r in rows)


def test_compare_matches_families_across_runs(mfu):
    base, new = (stage_stats(load(mfu[k])) for k in ("before", "after"))
    rows = {r["name"]: r for r in compare(base, new)["stages"]}
    assert rows["aten::to, seq = <n>, op_id = <n>"]["status"] == "both"
    assert sum(r["status"] == "both" for r in rows.values()) >= 0.9 * len(rows)
    # One stage per raw name: the runs' op_ids differ, so that family's names are not in both.
    raw = compare(*(stage_stats(load(mfu[k]), raw_names=True) for k in ("before", "after")))
    members = [r for r in raw["stages"] if r["name"].startswith("aten::to, seq = ")]
    assert sum(r["status"] == "both" for r in members) < 0.1 * len(members)


def chrome_file(tmp_path, events) -> str:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return str(path)


GOOD = [{"ph": "X", "name": f"good {i}", "ts": 100 * i, "dur": 10, "pid": 1, "tid": 1}
        for i in range(4)]
BAD = [{"ph": "X", "name": "negative", "ts": 1000, "dur": -500, "pid": 1, "tid": 1},
       {"ph": "X", "name": "no duration", "ts": 1100, "pid": 1, "tid": 1},
       {"ph": "E", "ts": 1200, "pid": 1, "tid": 1},
       {"ph": "X", "name": None, "ts": 1300, "dur": 1, "pid": 1, "tid": 1},
       {"ph": "X", "name": 7, "ts": 1400, "dur": 1, "pid": 1, "tid": 1},
       {"ph": "B", "name": "ends first", "ts": 1600, "pid": 1, "tid": 2},
       {"ph": "E", "ts": 1500, "pid": 1, "tid": 2}]


def test_malformed_chrome_events_are_skipped_and_said(tmp_path):
    path = chrome_file(tmp_path, GOOD + BAD[:2])
    table = load(path)
    assert sorted(table.name_of(i) for i in range(len(table))) == [f"good {i}" for i in range(4)]
    analysis = analyze(path, table)
    m = analysis.profile["malformed"]
    assert (m["skipped"], m["events"]) == (2, 6)
    assert m["first"].startswith("X event 'negative' at 1000 µs") and "duration" in m["first"]
    (check,) = [c for c in analysis.checks if c["name"].startswith("events are well formed")]
    assert check["ok"] and check["detail"].startswith("2 of 6 events skipped")
    assert "skipped 2 malformed of 6 events; first: X event 'negative'" in terminal(analysis,
                                                                                  True)


def test_a_mostly_malformed_file_fails_its_check(tmp_path):
    analysis = analyze(*(lambda p: (p, load(p)))(chrome_file(tmp_path, GOOD[:1] + BAD)))
    assert analysis.profile["malformed"]["skipped"] == len(BAD) - 1  # a B and its early E: one
    (check,) = [c for c in analysis.checks if not c["ok"]]
    assert check["name"].startswith("events are well formed") and "most of" in check["detail"]
    # An E before its B: neither a 0 ns range nor an unclosed one.
    assert analysis.profile["unclosed"] == 0 and analysis.profile["ranges"] == 1


def test_a_clean_profile_has_no_such_check(tmp_path):
    analysis = analyze(*(lambda p: (p, load(p)))(chrome_file(tmp_path, GOOD)))
    assert analysis.profile["malformed"] == {"skipped": 0, "events": 4, "first": None}
    assert len(analysis.checks) == 5


def test_an_nsys_range_that_ends_before_it_starts_is_skipped(tmp_path):
    path = tmp_path / "n.sqlite"
    with F.NsysFile(path) as f:
        f.range("fine", 0, 100, pid=7)
        f.range("backwards", 300, 200, pid=7)
        f.range("unclosed", 400, None, pid=7)
    table = load(str(path))
    names = sorted(table.name_of(i) for i in range(len(table)))
    assert names == ["fine", "unclosed"] and int(table.unclosed.sum()) == 1
    m = table.malformed.doc()
    assert m["skipped"] == 1 and "'backwards'" in m["first"] and "before its start" in m["first"]


def test_compare_says_what_it_skipped(tmp_path):
    path = chrome_file(tmp_path, GOOD + BAD[:1])
    done = subprocess.run([sys.executable, "-m", "mmscope.cli", "compare", "--no-cache", path,
                           path], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("skipped 1 malformed of 5 events") == 2
