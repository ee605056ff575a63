"""mmscope cache-size: exact curves on hand-written access logs (pinned entries, over-capacity
admission, connector hits, several engines, preemption), the one-pass model against a per-capacity
simulation of vLLM's EncoderCacheManager rule, and the command's output and errors."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmscope.carry import access_log
from mmscope.carry.ledger import Item
from mmscope.cache_size import model, trace
from mmscope.cache_size.command import main
from mmscope.cache_size.replay import replay
from mmscope.errors import UserError

SIZES = {"a": 16, "b": 16, "c": 16, "d": 16}


def write_log(path, *events, capacity=256, engine="100", bytes_per_embed=None):
    """Events: "r1 a" (access, MISS), "r1 a hit", "r1 a connector", "r1 a deferred", "-r1" (F),
    "a:32" gives an item's size; "@200 r1 a" puts the line on engine 200. A capacity line has
    the bytes of one embedding where `bytes_per_embed` is given (older logs have none)."""
    lines = [access_log.HEADER]
    engines = set()
    per_embed = "" if bytes_per_embed is None else f"\t{bytes_per_embed}"
    for n, ev in enumerate(events):
        eng = engine
        if ev.startswith("@"):
            eng, ev = ev[1:].split(" ", 1)
        if eng not in engines and capacity:
            lines.append(f"C\t{n}\t{eng}\t{capacity}{per_embed}\n")
        engines.add(eng)
        lines.append(_line(n, eng, ev.split()))
    path.write_text("".join(lines))
    return str(path)


def _line(n, eng, p):
    if p[0].startswith("-"):
        return f"F\t{n}\t{eng}\t{p[0][1:]}\n"
    key, _, size = p[1].partition(":")
    embeds = int(size) if size else SIZES.get(key, 16)
    flag = p[2] if len(p) > 2 else "miss"
    outcome, source = {"miss": ("MISS", "-"), "hit": ("HIT", "local"),
                       "connector": ("HIT", "connector"), "deferred": ("DEFERRED", "-")}[flag]
    return f"A\t{n}\t{eng}\t{p[0]}\t0\timage\t{key}\t{embeds}\t{outcome}\t{source}\n"


def curve_of(path, release="access"):
    return model.curve(trace.load(path), release)


def hits_at(c, *capacities):
    return {n: c.hits(n) for n in capacities}


def one_by_one(*keys):
    """Each key is its own request, freed right after its access."""
    out = []
    for i, k in enumerate(keys):
        out += [f"r{i} {k}", f"-r{i}"]
    return out


# --- exact curves on hand-written logs ------------------------------------------------------------
@pytest.mark.parametrize("release", model.RELEASES)
def test_lru_distances_in_embeddings(tmp_path, release):
    # a b a c c b a: the repeats need 32 (a over b), 16 (c at once), 48 (b over a, c), 48.
    c = curve_of(write_log(tmp_path / "x.log", *one_by_one(*"abaccba")), release)
    assert sorted(c.distances[: c.repeats].tolist()) == [16, 32, 48, 48]
    assert (c.queries, c.repeats, c.saturation) == (7, 4, 48)
    assert hits_at(c, 16, 31, 32, 47, 48, 1000) == {16: 1, 31: 1, 32: 2, 47: 2, 48: 4, 1000: 4}
    assert c.capacity_for(0.1) == 16
    assert c.capacity_for(0.25) == 32
    assert c.capacity_for(0.5) == 48
    assert c.capacity_for(0.6) is None  # only 4 of 7 accesses are repeats


PINNED = ["r1 a", "r2 b", "-r2", "r3 c", "-r3", "r4 b", "-r4", "r5 a", "-r5", "-r1"]


def test_entry_pinned_by_running_request_is_never_evicted(tmp_path):
    # r1 holds a throughout: at 32, c must evict b (a is pinned), so r4's b misses; r5's a hits
    # at every capacity because r1 still references it.
    c = curve_of(write_log(tmp_path / "x.log", *PINNED), "end")
    assert hits_at(c, 16, 32, 47, 48) == {16: 1, 32: 1, 47: 1, 48: 2}
    assert model.distances(next(iter(trace.load(str(tmp_path / "x.log")).engines.values())).events,
                           "end").tolist() == [model.COLD, model.COLD, model.COLD, 48, 0]


def test_release_at_access_is_lru_by_access(tmp_path):
    # The same log with references dropped at the access: b is 32 back, a 48 back.
    c = curve_of(write_log(tmp_path / "x.log", *PINNED), "access")
    assert hits_at(c, 16, 32, 48) == {16: 0, 32: 1, 48: 2}


def test_over_capacity_admission_is_trimmed_on_release(tmp_path):
    # Three requests pin 48 embeds; at 32 vLLM would defer c, the model admits it and trims the
    # oldest-freed (a) when references go: a then misses, c hits.
    path = write_log(tmp_path / "x.log", "r1 a", "r2 b", "r3 c", "-r1", "-r2", "-r3",
                     "r4 a", "r5 c", "-r4", "-r5")
    events = next(iter(trace.load(path).engines.values())).events
    assert model.distances(events, "end").tolist()[3:] == [48, 32]
    assert replay(events, 32, "end") == [False, False, False, False, True]


def test_connector_hit_counts_at_every_capacity_and_fills_the_cache(tmp_path):
    c = curve_of(write_log(tmp_path / "x.log", "r1 a connector", "-r1", *one_by_one("b", "a")))
    assert hits_at(c, 16, 32) == {16: 1, 32: 2}
    assert c.recorded_hits == 1


def test_deferred_lines_are_not_accesses(tmp_path):
    c = curve_of(write_log(tmp_path / "x.log", "r1 a deferred", "r1 a", "-r1", "r2 a deferred",
                           "r2 a hit", "-r2"))
    assert (c.queries, c.recorded_hits, hits_at(c, 16)) == (2, 1, {16: 1})


def test_engines_are_replayed_separately_and_summed(tmp_path):
    # Interleaved as one stream, a would be 16 back twice; per engine: X's a 16 back, Y's 32.
    path = write_log(tmp_path / "x.log", "@X r1 a", "@X -r1", "@Y r2 a", "@Y -r2", "@Y r3 b",
                     "@Y -r3", "@X r4 a", "@X -r4", "@Y r5 a", "@Y -r5")
    c = curve_of(path)
    assert (c.engines, c.queries) == (2, 5)
    assert hits_at(c, 16, 32) == {16: 1, 32: 2}


def test_preempted_request_commits_its_items_again(tmp_path):
    path = write_log(tmp_path / "x.log", "r1 a", "r1 b", "-r1", "r2 c", "-r2", "r1 a", "r1 b",
                     "-r1")
    c = curve_of(path, "end")
    assert c.distances[: c.repeats].tolist() == [48, 48]
    assert hits_at(c, 32, 48) == {32: 0, 48: 2}


def test_items_of_different_sizes_and_default_grid(tmp_path):
    c = curve_of(write_log(tmp_path / "x.log", *one_by_one("a:32", "b:8", "c:8", "b:8", "a:32"),
                           capacity=200))
    assert c.largest_item == 32
    assert hits_at(c, 32, 47, 48) == {32: 1, 47: 1, 48: 2}
    assert c.default_grid() == [32, 48, 200]  # largest item, saturation, recorded
    assert c.capacity_for(0.01) == 32  # never below the largest item


def test_default_grid_powers_of_two_between_largest_item_and_saturation(tmp_path):
    keys = [f"k{i}" for i in range(20)]
    c = curve_of(write_log(tmp_path / "x.log", *one_by_one(*keys, *keys), capacity=100))
    assert c.saturation == 320
    assert c.default_grid() == [16, 32, 64, 100, 128, 256, 320]


def test_reader_agrees_with_the_access_log_writer(tmp_path, monkeypatch):
    path = str(tmp_path / "w.log")
    w = access_log.AccessLogWriter(path, "7")
    w.capacity(64, 128)
    written = [("MISS", None), ("HIT", "local"), ("DEFERRED", None), ("HIT", "in_step"),
               ("HIT", "connector")]
    for i, (outcome, src) in enumerate(written):
        w.item(outcome, Item(f"req-{i}", 0, "image", f"h{i % 2}", 16 * (i + 1)), src)
        w.freed(f"req-{i}")
    w.flush()
    t = trace.load(path)
    e = t.engines["7"]
    assert (e.capacity, e.bytes_per_embed, t.bytes_per_embed) == (64, 128, 128)
    outcomes = {"MISS": trace.MISS, "HIT": trace.HIT}
    assert [ev[2:] for ev in e.events if ev[1] != trace.FREE] == [
        (16 * (i + 1), trace.CONNECTOR if src == "connector" else outcomes[outcome])
        for i, (outcome, src) in enumerate(written) if outcome != "DEFERRED"]
    assert (e.accesses, e.hits, e.largest_item) == (4, 3, 80)
    assert sum(ev[1] == trace.FREE for ev in e.events) == len(written)


def test_truncated_last_line_is_ignored(tmp_path):
    path = write_log(tmp_path / "x.log", *one_by_one("a", "a"))
    with open(path, "a") as f:
        f.write("A\t9\t100\tr9\t0\tim")
    assert trace.load(path).accesses == 2


# --- the one-pass model against the per-capacity simulation ---------------------------------------
@st.composite
def event_streams(draw):
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=7))
    ops = draw(st.lists(st.tuples(st.integers(0, 4), st.integers(-1, len(sizes) - 1),
                                  st.integers(0, 9)), max_size=60))
    events, next_req, live = [], 0, {}
    for slot, key, roll in ops:
        if key < 0 or roll == 0:  # a request of this slot finishes (or is preempted)
            if slot in live:
                events.append((live.pop(slot), trace.FREE, 0, 0))
            continue
        if slot not in live:
            live[slot], next_req = next_req, next_req + 1
        events.append((live[slot], key, sizes[key], trace.CONNECTOR if roll == 9 else roll % 2))
    events += [(req, trace.FREE, 0, 0) for req in live.values()]
    return sizes, events


@pytest.mark.parametrize("release", model.RELEASES)
@settings(max_examples=300, deadline=None)  # 300 random logs per policy
@given(stream=event_streams())
def test_one_pass_equals_per_capacity_simulation(stream, release):
    sizes, events = stream
    d = model.distances(events, release)
    for capacity in range(max(sizes), sum(sizes) + 2):
        assert (d <= capacity).tolist() == replay(events, capacity, release), capacity


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 50)), max_size=80,
                unique_by=lambda t: t[0]))
def test_earlier_greater_sums(pairs):
    values = np.array([p[0] for p in pairs], np.int64)
    weights = np.array([p[1] for p in pairs], np.int64)
    want = [sum(int(weights[j]) for j in range(i) if values[j] > values[i])
            for i in range(len(pairs))]
    assert model._earlier_greater_sums(values, weights).tolist() == want


# --- the command ----------------------------------------------------------------------------------
def run_main(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_output(tmp_path, capsys):
    path = write_log(tmp_path / "x.log", *one_by_one(*"abaccba"), capacity=32)
    rc, out, _ = run_main(capsys, path, "--json", "--target-hit-rate", "0.5", "--hidden-size",
                          "4096", "--dtype", "float16")
    assert rc == 0
    r = json.loads(out)
    assert [(p["capacity_tokens"], p["hits"]) for p in r["curve"]] == [(16, 1), (32, 2), (48, 4)]
    assert r["curve"][1]["hit_rate"] == pytest.approx(2 / 7)
    assert r["curve"][1]["capacity_bytes"] == 32 * 4096 * 2
    assert (r["recommended_tokens"], r["recommended_bytes"]) == (48, 48 * 8192)
    assert (r["recorded_capacity_tokens"], r["saturation_tokens"]) == (32, 48)
    assert r["recorded_hit_rate"] == 0  # the hand-written log says MISS everywhere
    assert r["model_hit_rate_at_recorded"] == pytest.approx(2 / 7)
    assert r["max_hit_rate"] == pytest.approx(4 / 7)


def test_table_output_and_explicit_capacities(tmp_path, capsys):
    path = write_log(tmp_path / "x.log", *one_by_one(*"abaccba"), capacity=32)
    rc, out, _ = run_main(capsys, path, "--capacities", "16,48", "64", "--hidden-size", "64",
                          "--dtype", "float32")
    assert rc == 0
    rows = [line.split() for line in out.splitlines() if line.split()[0].isdigit()]
    assert [r[0] for r in rows] == ["16", "48", "64"]
    assert rows[0][-2:] == ["14.3%", "1"]
    assert rows[1][-5:] == ["57.1%", "4", "every", "repeat", "hits"]
    assert "12.0 KiB" in out  # 48 x 64 x 4 bytes
    assert "80% hits: unreachable" in out and "57.1%" in out


TWO_ENGINES = [*(f"@X {ev}" for ev in one_by_one(*"abaccba")),
               "@Y q0 d:8", "@Y -q0", "@Y q1 d:8 hit", "@Y -q1"]
# X: repeats 16, 32, 48, 48 embeds back; Y: its d 8 back, logged as a hit. 9 accesses, 5 repeats.


def test_json_report_holds_every_figure(tmp_path, capsys):
    path = write_log(tmp_path / "x.log", *TWO_ENGINES, capacity=32)
    rc, out, _ = run_main(capsys, path, "--json", "--target-hit-rate", "0.5", "--hidden-size",
                          "64", "--dtype", "float32")
    assert rc == 0
    kib = 256  # bytes per embedding: 64 x float32
    assert json.loads(out) == {
        "log": path, "release": "access", "queries": 9, "repeats": 5, "largest_item_tokens": 16,
        "curve": [{"capacity_tokens": n, "capacity_bytes": n * kib, "hits": h, "hit_rate": h / 9}
                  for n, h in ((16, 2), (32, 3), (48, 5))],
        "target_hit_rate": 0.5, "recommended_tokens": 48, "recommended_bytes": 48 * kib,
        "max_hit_rate": 5 / 9, "saturation_tokens": 48, "saturation_bytes": 48 * kib,
        "recorded_capacity_tokens": 32, "recorded_capacity_bytes": 32 * kib,
        "recorded_hit_rate": 1 / 9, "model_hit_rate_at_recorded": 3 / 9,
        "bytes_per_token": kib, "bytes_from": "64 x float32",
        "engines": [{"engine": "X", "capacity_tokens": 32, "queries": 7, "hits": 0},
                    {"engine": "Y", "capacity_tokens": 32, "queries": 2, "hits": 1}]}


def test_bytes_as_the_access_log_recorded_them(tmp_path, capsys):
    """vLLM's engine writes one embedding's bytes on its capacity line: no option needed."""
    path = write_log(tmp_path / "x.log", *TWO_ENGINES, capacity=32, bytes_per_embed=128)
    rc, out, _ = run_main(capsys, path, "--json")
    r = json.loads(out)
    assert (rc, r["bytes_per_token"], r["bytes_from"]) == (0, 128,
                                                         "128 an embedding, the access log's")
    assert r["recorded_capacity_bytes"] == 32 * 128
    rc, out, _ = run_main(capsys, path, "--json", "--hidden-size", "64", "--dtype", "float32")
    assert json.loads(out)["bytes_per_token"] == 256  # the option wins over the log


def words(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.splitlines()]


@pytest.mark.parametrize("release,released_at", [("access", "each access"),
                                                 ("end", "request end")])
def test_table_prints_every_figure(tmp_path, capsys, release, released_at):
    path = write_log(tmp_path / "x.log", *TWO_ENGINES, capacity=32)
    rc, out, _ = run_main(capsys, path, "--target-hit-rate", "0.5", "--hidden-size", "64",
                          "--dtype", "float32", "--release", release)
    assert rc == 0
    assert words(out) == [
        f"{path}: 9 encoder-cache accesses, 5 repeats, largest item 16 embeds, 2 engines "
        "replayed separately (hits summed)",
        "recorded at 32 embeds: 11.1% hits in the log, 33.3% by the model",
        "model: vLLM 0.32 eviction (unreferenced entries, oldest freed first), references "
        f"released at {released_at}",
        "capacity (embeds) bytes (64 x float32) hit rate hits",
        "16 4.0 KiB 22.2% 2",
        "32 8.0 KiB 33.3% 3 recorded",
        "48 12.0 KiB 55.6% 5 every repeat hits",
        "50% hits: 48 embeds (12.0 KiB) or more"]


def test_unreachable_target_names_the_repeats_and_the_saturation_size(tmp_path, capsys):
    path = write_log(tmp_path / "x.log", *TWO_ENGINES, capacity=32)
    rc, out, _ = run_main(capsys, path, "--hidden-size", "64", "--dtype", "float32")
    assert words(out)[-1] == ("80% hits: unreachable on this traffic, only 55.6% of accesses are "
                              "repeats (reached from 48 embeds (12.0 KiB))")


def test_unreachable_target_in_json_is_null(tmp_path, capsys):
    rc, out, _ = run_main(capsys, write_log(tmp_path / "x.log", *one_by_one("a", "b")), "--json")
    r = json.loads(out)
    assert (rc, r["recommended_tokens"], r["max_hit_rate"]) == (0, None, 0)
    assert [p["capacity_tokens"] for p in r["curve"]] == [16, 256]


def test_plot_is_written(tmp_path, capsys):
    png = tmp_path / "curve.png"
    rc, _, err = run_main(capsys, write_log(tmp_path / "x.log", *one_by_one(*"abaccba")),
                          "--plot", str(png), "--hidden-size", "64", "--target-hit-rate", "0.3")
    assert rc == 0 and f"wrote {png}" in err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("content, argv, message", [
    (None, [], "no such file"),
    ("hello world\n", [], "not an encoder-cache access log"),
    (b"\x00\xff\xfe binary", [], "binary data"),
    (access_log.HEADER, [], "no encoder-cache accesses"),
    (access_log.HEADER + "C\t1\t9\t64\nF\t2\t9\tr1\n", [], "no encoder-cache accesses"),
    (access_log.HEADER + "A\t1\t9\tr\t0\timage\tk\t16\tMISS\t-\nA\tbroken\n", [], "x.log:3:"),
    ("A\t1\t9\tr\t0\timage\tk\t16\tMISS\t-\n", ["--target-hit-rate", "1.5"], "--target-hit-rate"),
    ("A\t1\t9\tr\t0\timage\tk\t16\tMISS\t-\n", ["--capacities", "8"], "below the largest item"),
    ("A\t1\t9\tr\t0\timage\tk\t16\tMISS\t-\n", ["--capacities", "1k"], "not a whole number"),
])
def test_bad_input_is_one_line(tmp_path, capsys, content, argv, message):
    path = tmp_path / "x.log"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    rc, out, err = run_main(capsys, str(path), *argv)
    assert rc == 2 and out == ""
    assert err.startswith("mmscope: error: ") and message in err and err.count("\n") == 1


def test_module_entry_point_and_cli_name(tmp_path):
    path = write_log(tmp_path / "x.log", *one_by_one("a", "a"))
    proc = subprocess.run([sys.executable, "-m", "mmscope.cache_size.command", path, "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["curve"][0]["hits"] == 1
    missing = str(tmp_path / "missing.log")
    bad = subprocess.run([sys.executable, "-m", "mmscope.cli", "cache-size", missing],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip() == f"mmscope: error: {missing}: no such file"


def test_user_error_from_trace_load(tmp_path):
    with pytest.raises(UserError):
        trace.load(str(tmp_path))


def test_log_without_capacity_line(tmp_path, capsys):
    path = write_log(tmp_path / "x.log", *one_by_one("a", "a"), capacity=None)
    rc, out, _ = run_main(capsys, path, "--json")
    r = json.loads(out)
    assert (r["recorded_capacity_tokens"], r["model_hit_rate_at_recorded"]) == (None, None)
    assert [p["capacity_tokens"] for p in r["curve"]] == [16]
    rc, out, _ = run_main(capsys, path)
    assert rc == 0 and "recorded at" not in out and "80% hits: unreachable" in out
