"""vLLM's compiled mode (no enforce_eager: Dynamo traces the language model once, inductor compiles
it): with every range on, the plugin-off engine's tokens, exact counts, the stage tree, and not one
graph break or recompilation more than without the plugin (docs/gpu-runners.md).

Under V1 only: the V2 runner runs here through Triton's interpreter, for which inductor has no
target to compile (the same failure with the plugin off).
"""
from __future__ import annotations

import pytest

from mmscope import stages
from tests.kit import runners, traces as tk
from tests.kit.engine import results_run

pytestmark = pytest.mark.vllm

# Dynamo traces afresh in each run: no compiled artifact of an earlier run is loaded.
COMPILED = {**runners.V1_ONLY, "VLLM_DISABLE_COMPILE_CACHE": "1"}


def test_compiled_engine_gives_the_same_tokens_exact_counts_the_tree_and_no_graph_break(
        tiny_model, tmp_path):
    bare = results_run(tiny_model, "compiled", env={**COMPILED, "MMSCOPE_DISABLE": "1"})
    traced = results_run(tiny_model, "compiled", env={
        **COMPILED, "MMSCOPE_TRACE": "chrome", "MMSCOPE_TRACE_DIR": str(tmp_path)})
    assert traced["tokens"] == bare["tokens"]
    # [1], [2, 1], text: the second 1 is a hit in the step; then [1], [2, 1], text, [3]: only 3
    # is new. Queries, hits, misses of each batch.
    assert traced["counts"] == [[3, 1, 2], [4, 3, 1]]
    assert not [h for h, s in traced["hooks"].items() if s.startswith("off")]
    # Dynamo traced the model, and the plugin added no frame (a recompilation is one more), no
    # graph and no graph break.
    assert traced["dynamo"]["graphs"] >= 1
    assert traced["dynamo"] == bare["dynamo"]

    rs, _ = tk.load(tmp_path)
    assert len(tk.named(rs, stages.VIT_FORWARD)) == 2  # one encoder batch in each generate()
    preprocess = tk.named(rs, stages.PREPROCESS)
    children = [r for r in rs if r.name in stages.PREPROCESS_SIBLINGS]
    assert {r.name for r in children} == {stages.VIT_FORWARD, stages.GATHER_MM_EMBEDDINGS,
                                          stages.EMBED_INPUT_IDS, stages.PREPARE_MM_INPUTS}
    assert all(tk.parent_of(c, preprocess + children) in preprocess for c in children)
    assert {stages.PREPROCESS, stages.FORWARD, *(c.name for c in children)} <= \
        tk.analyzed_stages(tmp_path)
