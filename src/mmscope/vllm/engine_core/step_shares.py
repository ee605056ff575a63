"""EngineCore: each step's encoder and EC-load time shared among the multimodal requests whose
items it computed or loaded, by embeddings (docs/design.md §4a)."""
from __future__ import annotations

from mmscope import stages
from mmscope.carry import ttft_split
from mmscope.emit.stage_timer import WORKER
from mmscope.vllm.engine_core.state import EngineState


def share_step(scheduler, state: EngineState | None, scheduler_output, sent) -> None:
    """The step's encoder time shared among the items it computed, its EC-load time among the
    items the connector loaded. A worker process sent exactly this step's durations (`sent`);
    one in this process left its step totals in WORKER."""
    in_process = WORKER.take_step() if WORKER.step_ns or WORKER.clock.pending else None
    computed = scheduler_output.scheduled_encoder_inputs
    if state is None or not (computed or state.ledger.loaded):
        return  # most steps: nothing was encoded or loaded
    step_ns = {k: sum(v) for k, v in sent.items()} if sent else (in_process or {})
    loaded = state.ledger.take_loaded()
    shares = state.shares
    if not shares.open:
        return
    if computed:
        weights: dict[str, int] = {}
        for request_id, input_ids in computed.items():
            request = scheduler.requests.get(request_id)
            if request is not None:
                weights[request_id] = sum(request.mm_features[i].mm_position.get_num_embeds()
                                          for i in input_ids)
                shares.computed(request_id, len(input_ids))
        shares.share(ttft_split.ENCODER, step_ns.get(stages.VIT_FORWARD, 0), weights)
    if loaded:
        weights = {}
        for item in loaded:
            weights[item.request_id] = weights.get(item.request_id, 0) + item.embeds
        shares.share(ttft_split.EC_LOAD, step_ns.get(stages.EC_LOAD, 0), weights)


def past_first_token(scheduler, request_id: str) -> bool:
    """The request has its first token (or is gone): its encoder work is over."""
    request = scheduler.requests.get(request_id)
    return request is None or request.num_output_tokens > 0
