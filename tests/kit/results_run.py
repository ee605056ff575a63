"""Generate a fixed workload on the tiny model in-process and print the token ids as JSON;
with `break`, mmscope's ledger is sabotaged half-way to prove a failing hook changes nothing; with
`vllm-stats`, vLLM's own processor timing is on and its per-request stages are printed too; with
`compiled`, the engine runs compiled (no enforce_eager) and the encoder-cache counts of each
batch and what Dynamo traced (graphs, frames, graph breaks) are printed too.

Usage (from the repository's root):
    python -m tests.kit.results_run MODEL_DIR [break | vllm-stats | compiled]
"""
import json
import logging
import sys

from tests.kit.engine import counters, image, offline_llm, prompt

COUNTS = ("encoder_cache_queries", "encoder_cache_hits", "encoder_cache_misses")


class Sabotaged:
    def __getattr__(self, name):
        raise RuntimeError(f"sabotaged ledger: {name}")


def main():
    from vllm import SamplingParams

    vllm_stats, compiled = sys.argv[2:] == ["vllm-stats"], sys.argv[2:] == ["compiled"]
    llm = offline_llm(sys.argv[1], enable_mm_processor_stats=vllm_stats, enforce_eager=not compiled)
    warnings = []
    handler = logging.Handler()
    handler.emit = lambda r: warnings.append(r.getMessage())
    logging.getLogger("vllm.mmscope").addHandler(handler)
    sp = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    batch = [prompt([image(1)]), prompt([image(2), image(1)], "Two?"), prompt([], "Text only")]
    outs = llm.generate(batch, sp, use_tqdm=False)
    counts = [encoder_cache_counts(llm)]
    if sys.argv[2:] == ["break"]:
        from mmscope.vllm.engine_core.state import state_of
        sched = llm.llm_engine.engine_core.engine_core.scheduler
        state_of(sched.encoder_cache_manager).ledger = Sabotaged()
    outs += llm.generate(batch + [prompt([image(3)], "New?")], sp, use_tqdm=False)
    counts.append([n - before for n, before in zip(encoder_cache_counts(llm), counts[0])])
    from vllm.benchmarks.mm_processor import get_timing_stats_from_engine

    from mmscope.vllm.instrumentor import get_instrumentor
    stages = {rid: {k: v > 0 for k, v in d.items() if k.endswith("_secs")}
              for rid, d in get_timing_stats_from_engine(llm.llm_engine).items()}
    print("RESULT " + json.dumps({
        "vllm_stages": sorted(stages.values(), key=sorted),
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "hooks": get_instrumentor().status(),
        "counts": counts,
        "dynamo": dynamo_traced(),
        "warnings": [w for w in warnings if "mmscope" in w]}))


def encoder_cache_counts(llm) -> list[int]:
    """Queries, hits, misses so far (none with the plugin off)."""
    now = counters(llm)
    return [int(now.get(k, 0)) for k in COUNTS]


def dynamo_traced() -> dict:
    """What Dynamo traced in this process (the worker runs in it): frames compiled (each
    recompilation is one more), graphs, and each graph break's reason with its count."""
    from torch._dynamo.utils import counters as dynamo

    return {"frames": dict(dynamo["frames"]), "graphs": dynamo["stats"]["unique_graphs"],
            "graph_breaks": dict(dynamo["graph_break"])}


if __name__ == "__main__":
    main()
