"""EC connector: a producer engine writes encoder outputs through ECExampleConnector; a consumer
engine counts them as connector hits and never runs its encoder. The consumer runs the test run's
model runner; the producer always V1 (under V2, vLLM's encoder-only instance fails in vLLM)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mmscope import stages
from tests.kit.item_ways import agree_with_the_counters, ways
from tests.kit import runners, traces as tk

pytestmark = [pytest.mark.vllm, pytest.mark.runners]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_role(role, model, shared, seeds, trace_dir):
    # Tracing on as well: the same runs show where the connector's ranges land.
    env = dict(os.environ, MMSCOPE_TRACE="chrome", MMSCOPE_TRACE_DIR=str(trace_dir),
               **(runners.V1_ONLY if role == "ec_producer" else {}))
    proc = subprocess.run(
        [sys.executable, "-m", "tests.kit.ec_connector_run", role, model, str(shared),
         ",".join(map(str, seeds))],
        capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_producer_then_consumer(tiny_model, tmp_path):
    shared = tmp_path / "ec_cache"
    produced = run_role("ec_producer", tiny_model, shared, [41, 42, 41], tmp_path / "p")
    # Producer: two distinct images computed (and saved), the repeat is a local/in-step hit.
    assert produced["encoder_items"] == 2
    assert (produced["encoder_cache_queries"], produced["encoder_cache_misses"]) == (3, 2)
    assert len(os.listdir(shared)) == 2

    consumed = run_role("ec_consumer", tiny_model, shared, [41, 42], tmp_path / "c")
    assert consumed["encoder_items"] == 0, "the consumer's encoder must never run"
    assert consumed["encoder_cache_queries"] == 2
    assert consumed["encoder_cache_misses"] == 0
    assert consumed["encoder_cache_hits_by_source{source=connector}"] == 2

    # Each item's way: the producer computed two and reused the repeat (its processor cache
    # held it); the consumer loaded both, its own processor cache new.
    assert ways(produced) == ({"miss": 2, "hit": 1}, {"computed": 2, "cache_hit": 1})
    assert ways(consumed) == ({"miss": 2}, {"ec_loaded": 2})
    agree_with_the_counters(produced), agree_with_the_counters(consumed)  # vLLM's, mmscope's

    # Transfers through LLM.get_metrics(): two items saved, the same two loaded, byte for byte.
    # (Its reader makes every counter an int, so the seconds, well under one, read 0 there.)
    from safetensors.torch import load_file

    stored = sum(load_file(str(f))["ec_cache"].nbytes for f in shared.glob("*/*.safetensors"))
    for counts, direction, idle in ((produced, "save", "load"), (consumed, "load", "save")):
        moved = {k: counts[f"ec_connector_transfer_{k}{{direction={direction}}}"]
                 for k in ("items", "bytes")}
        assert (moved["items"], moved["bytes"]) == (2, stored)
        assert f"ec_connector_transfer_seconds{{direction={direction}}}" in counts
        assert counts[f"ec_connector_transfer_items{{direction={idle}}}"] == 0

    # Ranges: saves on the producer, beside (never inside) the encoder forward; loads on the
    # consumer, whose encoder never runs.
    p_ranges, _ = tk.load(tmp_path / "p")
    c_ranges, _ = tk.load(tmp_path / "c")
    saves, vits = tk.named(p_ranges, stages.EC_SAVE), tk.named(p_ranges, stages.VIT_FORWARD)
    assert len(saves) == 2 and vits
    assert not any(tk.within(s, v) for s in saves for v in vits)
    preprocess = tk.named(p_ranges, stages.PREPROCESS)
    assert all(tk.parent_of(s, preprocess + saves).name == stages.PREPROCESS for s in saves)
    loads = tk.named(c_ranges, stages.EC_LOAD)
    c_preprocess = tk.named(c_ranges, stages.PREPROCESS)
    assert loads and all(tk.parent_of(r, c_preprocess + loads) in c_preprocess for r in loads)
    assert not tk.named(c_ranges, stages.VIT_FORWARD) and not tk.named(c_ranges, stages.EC_SAVE)
