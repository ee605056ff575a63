"""Each word of the vocabulary is spelled once: outcomes, hit sources and features in
vocabulary.py, series names in expose/ (the rest of the package imports them)."""
from __future__ import annotations

import ast
import pathlib

import mmscope
from mmscope.expose import metrics, ttft_histograms
from mmscope.vocabulary import HIT_SOURCES, Feature, Outcome

ROOT = pathlib.Path(mmscope.__file__).parent
# Where a feature's name means the feature: elsewhere "ranges" or "metrics" are other words.
ADAPTER = ("vllm", "expose", "carry", "emit")


def constants(folders=None) -> list[tuple[str, str]]:
    """(string constant, where) of every module of the package (or of those folders)."""
    found = []
    for path in ROOT.rglob("*.py"):
        where = path.relative_to(ROOT)
        if folders is not None and where.parts[0] not in folders:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.append((node.value, f"{where}:{node.lineno}"))
    return found


def series_names() -> set[str]:
    families = (metrics.COUNTERS, metrics.LABELED, metrics.GAUGES, metrics.TRANSFER_COUNTERS,
                metrics.MEDIA)
    return {v[0] for family in families for v in family.values()} | {
        metrics.STAGE_HISTOGRAM[0], metrics.HOOK_OFF[0], ttft_histograms.PART_HISTOGRAM[0],
        ttft_histograms.TTFT_HISTOGRAM[0]}


def test_outcomes_and_hit_sources_are_spelled_in_the_vocabulary_only():
    words = {str(o) for o in Outcome} | set(HIT_SOURCES)
    elsewhere = [(v, w) for v, w in constants() if v in words and w.split(":")[0] != "vocabulary.py"]
    assert not elsewhere, elsewhere


def test_features_are_spelled_in_the_vocabulary_only():
    words = {str(f) for f in Feature}
    elsewhere = [(v, w) for v, w in constants(ADAPTER) if v in words]
    assert not elsewhere, elsewhere


def test_series_names_are_spelled_where_they_are_defined_only():
    names = series_names()
    assert len(names) > 30 and "vllm:encoder_cache_hits" in names  # the walk saw the series
    elsewhere = [(v, w) for v, w in constants() if v in names and w.split("/")[0] != "expose"]
    assert not elsewhere, elsewhere
    defined = [v for v, w in constants(("expose",)) if v in names]
    assert sorted(defined) == sorted(names), "a series name spelled twice in expose/"
