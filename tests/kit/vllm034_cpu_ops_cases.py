"""Seeded batches run through the seven ops of vLLM 0.34's standalone CPU runner, on either
side of tests/vllm034/test_cpu_ops.py:

- `cpu`: vLLM's CPU wrappers (`vllm/v1/worker/cpu/*`), which call the ops under
  `torch.ops._C`: here the stand-ins of tests/kit/startup/vllm034/vllm034_cpu_ops.py;
- `triton`: the same calls on Model Runner V2's wrappers (`vllm/v1/worker/gpu/*`), whose Triton
  kernels the ops replace, run by Triton's interpreter. vLLM takes Triton's kernels only in a
  process started with the `v2` runner, so this side runs as
  `python -m tests.kit.vllm034_cpu_ops_cases OUT SEEDS` in one (tests/kit/vllm034.py).

A batch mixes requests in their prefill (chunked or whole) with decoding ones and ones at their
last prompt token, these two with draft tokens, in a random order of request slots; the sampler's rows have temperatures of 0 and not,
rows of no request, seeds of either sign, drafting or not, fp32 or fp64.
"""
from __future__ import annotations

import sys

import torch

MAX_REQS, MAX_MODEL_LEN, BLOCK_SIZE, NUM_SPEC, VOCAB = 8, 96, 16, 2, 2500
MAX_TOKENS = 256


def batch(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)

    def randint(low, high, size=()):
        return torch.randint(low, high, size, generator=g)

    num_reqs = int(randint(1, 7))
    idx_mapping = torch.randperm(MAX_REQS, generator=g)[:num_reqs].to(torch.int32)
    prefill_len = randint(1, 64, (MAX_REQS,)).to(torch.int32)
    num_computed = torch.zeros(MAX_REQS, dtype=torch.int32)
    query_lens, num_logits = [], []
    for r in idx_mapping.tolist():
        prompt, kind = int(prefill_len[r]), int(randint(0, 3))
        if kind == 0:  # in its prefill: a chunk of what is left, or all of it
            done = int(randint(0, prompt))
            query_lens.append(int(randint(1, prompt - done + 1)))
            num_logits.append(1)
        else:  # decoding, or its last prompt token, with 0 to NUM_SPEC draft tokens
            done = prompt - 1 if kind == 1 else prompt + int(randint(0, 20))
            query_lens.append(1 + int(randint(0, NUM_SPEC + 1)))
            num_logits.append(query_lens[-1])
        num_computed[r] = done
    query_start_loc = torch.zeros(num_reqs + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.tensor(query_lens).cumsum(0)
    cu_num_logits = torch.zeros(num_reqs + 1, dtype=torch.int32)
    cu_num_logits[1:] = torch.tensor(num_logits).cumsum(0)
    num_tokens = int(query_start_loc[-1])
    skipped = idx_mapping.clone()  # post_update skips rows of no request (index < 0)
    skipped[int(randint(0, num_reqs))] = -1
    num_rows = 3 + int(randint(0, 8))
    idx_rows = randint(0, MAX_REQS, (num_rows,)).to(torch.int32)
    idx_rows[int(randint(0, num_rows))] = -1
    temperature = torch.rand(MAX_REQS, generator=g) * 2
    temperature[randint(0, MAX_REQS, (3,))] = 0.0
    return dict(
        num_reqs=num_reqs, num_tokens=num_tokens, idx_mapping=idx_mapping,
        prefill_len=prefill_len, num_computed=num_computed, query_start_loc=query_start_loc,
        cu_num_logits=cu_num_logits, num_logits=int(cu_num_logits[-1]),
        all_token_ids=randint(0, VOCAB, (MAX_REQS, MAX_MODEL_LEN)).to(torch.int32),
        last_sampled=randint(0, VOCAB, (MAX_REQS, 1)),
        draft_tokens=randint(0, VOCAB, (MAX_REQS, NUM_SPEC)),
        skipped=skipped, sampled=randint(0, VOCAB, (num_reqs, NUM_SPEC + 1)),
        num_sampled=randint(0, NUM_SPEC + 2, (num_reqs,)).to(torch.int32),
        num_rejected=randint(0, NUM_SPEC + 1, (num_reqs,)).to(torch.int32),
        total_len=(prefill_len + randint(0, 20, (MAX_REQS,))).to(torch.int32),
        block_ids=[randint(1, 1000, (MAX_MODEL_LEN // BLOCK_SIZE,)).tolist()
                   for _ in range(MAX_REQS)],
        num_reqs_padded=num_reqs + int(randint(0, 3)),
        logits=torch.randn(num_rows, VOCAB, generator=g) * 4, idx_rows=idx_rows,
        temperature=temperature, seeds=randint(-2**62, 2**62, (MAX_REQS,)),
        positions=randint(0, MAX_MODEL_LEN, (num_rows,)),
        apply_temperature=bool(randint(0, 2)), is_drafting=bool(randint(0, 2)),
        use_fp64=bool(randint(0, 2)))


def _wrappers(side: str):
    # What 0.34's CPU worker imports first: CPU stand-ins for CUDA's APIs (pinned memory,
    # streams) and, under Triton, CPU buffers for V2's device ones.
    import vllm.v1.worker.cpu.shm  # noqa: F401

    if side == "cpu":
        from vllm.v1.worker.cpu import input_batch
        from vllm.v1.worker.cpu.block_table import CPUBlockTables as tables
        from vllm.v1.worker.cpu.gumbel import gumbel_sample
    elif side == "triton":
        from vllm.v1.worker.gpu import input_batch
        from vllm.v1.worker.gpu.block_table import BlockTables as tables
        from vllm.v1.worker.gpu.sample.gumbel import gumbel_sample
    else:
        raise ValueError(side)
    return input_batch, tables, gumbel_sample


def outputs(side: str, seed: int) -> dict[str, torch.Tensor]:
    """Every tensor each op writes or returns, for the batch of `seed`."""
    ib, tables_cls, gumbel_sample = _wrappers(side)
    b = batch(seed)
    out = {}

    input_ids = torch.full((MAX_TOKENS,), -1, dtype=torch.int32)
    lookahead = torch.full((2, MAX_REQS), -1, dtype=torch.int32)
    ib.prepare_prefill_inputs(input_ids, lookahead, b["idx_mapping"], b["query_start_loc"],
                              b["all_token_ids"], b["prefill_len"], b["num_computed"])
    out["prefill.input_ids"], out["prefill.next_prefill_tokens"] = input_ids.clone(), lookahead

    pos = torch.full((MAX_TOKENS,), -1, dtype=torch.int64)
    seq_lens = torch.full((MAX_REQS,), -1, dtype=torch.int32)
    ib.prepare_pos_seq_lens(b["idx_mapping"], b["query_start_loc"], b["num_computed"], pos,
                            seq_lens)
    out["pos_seq_lens.pos"], out["pos_seq_lens.seq_lens"] = pos, seq_lens

    out["combine.logits_indices"] = ib.combine_sampled_and_draft_tokens(
        input_ids, b["idx_mapping"], b["last_sampled"], b["query_start_loc"],
        seq_lens[:b["num_reqs"]], b["prefill_len"], b["draft_tokens"], b["cu_num_logits"],
        b["num_logits"], 1)
    out["combine.input_ids"] = input_ids

    state = {k: b[k].clone() for k in ("num_computed", "last_sampled", "all_token_ids",
                                        "total_len")}
    bins = torch.zeros(MAX_REQS, VOCAB, dtype=torch.int32)
    ib.post_update(b["skipped"], state["num_computed"], state["last_sampled"], bins,
                   b["sampled"], b["num_sampled"], b["num_rejected"], b["query_start_loc"],
                   state["all_token_ids"], state["total_len"])
    out.update({f"post_update.{k}": v for k, v in state.items()})
    out["post_update.output_bin_counts"] = bins

    tables = tables_cls(block_sizes=[BLOCK_SIZE], max_num_reqs=MAX_REQS,
                        max_num_batched_tokens=MAX_TOKENS,
                        max_num_blocks_per_group=[MAX_MODEL_LEN // BLOCK_SIZE],
                        device=torch.device("cpu"))
    for r, seq_len in zip(b["idx_mapping"].tolist(), seq_lens.tolist()):
        needed = -(-seq_len // BLOCK_SIZE)
        tables.append_block_ids(r, (b["block_ids"][r][:needed],), overwrite=False)
    if side == "triton":  # V2's tables stage their writes for a device copy
        tables.apply_staged_writes()
    (gathered,) = tables.gather_block_tables(b["idx_mapping"], b["num_reqs_padded"])
    out["block_table.gathered"] = gathered.clone()
    out["block_table.slot_mappings"] = tables.compute_slot_mappings(
        b["idx_mapping"], b["query_start_loc"], pos, MAX_TOKENS).clone()

    out["gumbel.sampled"] = gumbel_sample(
        b["logits"].clone(), b["idx_rows"], b["temperature"], b["seeds"], b["positions"],
        apply_temperature=b["apply_temperature"], is_drafting=b["is_drafting"],
        use_fp64=b["use_fp64"])
    return out


if __name__ == "__main__":
    path, count = sys.argv[1], int(sys.argv[2])
    torch.save([outputs("triton", seed) for seed in range(count)], path)
