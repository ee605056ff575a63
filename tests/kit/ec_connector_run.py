"""Run one ECExampleConnector role on the tiny model in-process and print counters as JSON.

Usage (from the repository's root): python -m tests.kit.ec_connector_run ROLE MODEL_DIR SHARED_DIR IMAGE_SEEDS (comma-separated)
"""
import json
import sys

from tests.kit.engine import EncoderWork, counters, image, offline_llm, prompt


def main():
    role, model, shared, seeds = sys.argv[1:5]
    from vllm import SamplingParams
    from vllm.config import ECTransferConfig

    work = EncoderWork()  # before the engine: a V2 runner wraps the model's method as it loads
    llm = offline_llm(model, ec_transfer_config=ECTransferConfig(
        ec_connector="ECExampleConnector", ec_role=role,
        ec_connector_extra_config={"shared_storage_path": shared}))
    work.reset()
    prompts = [prompt([image(int(s))], f"Question {n}?") for n, s in enumerate(seeds.split(","))]
    outs = llm.generate(prompts, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True),
                        use_tqdm=False)
    c = counters(llm)
    print("RESULT " + json.dumps({
        "encoder_items": work.items,
        "outputs": [list(o.outputs[0].token_ids) for o in outs],
        **{k: v for k, v in c.items() if k.startswith(("encoder_cache", "ec_connector"))}}))


if __name__ == "__main__":
    main()
