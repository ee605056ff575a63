"""Generate a fixed workload on the tiny model in-process and print the token ids as JSON;
with `break`, mmscope's ledger is sabotaged half-way to prove a failing hook changes nothing.

Usage: python tests/results_run.py MODEL_DIR [break]
"""
import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.vllm_kit import image, offline_llm, prompt  # noqa: E402


class Sabotaged:
    def __getattr__(self, name):
        raise RuntimeError(f"sabotaged ledger: {name}")


def main():
    from vllm import SamplingParams

    llm = offline_llm(sys.argv[1])
    warnings = []
    handler = logging.Handler()
    handler.emit = lambda r: warnings.append(r.getMessage())
    logging.getLogger("vllm.mmscope").addHandler(handler)
    sp = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    batch = [prompt([image(1)]), prompt([image(2), image(1)], "Two?"), prompt([], "Text only")]
    outs = llm.generate(batch, sp, use_tqdm=False)
    if sys.argv[2:] == ["break"]:
        from mmscope.vllm.encoder_cache import LEDGER
        sched = llm.llm_engine.engine_core.engine_core.scheduler
        setattr(sched.encoder_cache_manager, LEDGER, Sabotaged())
    outs += llm.generate(batch + [prompt([image(3)], "New?")], sp, use_tqdm=False)
    from mmscope.vllm.instrumentor import get_instrumentor
    print("RESULT " + json.dumps({
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "hooks": get_instrumentor().status(),
        "warnings": [w for w in warnings if "mmscope" in w]}))


if __name__ == "__main__":
    main()
