"""EngineCore: each step's encoder and EC-load time shared among the items it computed or loaded,
by embeddings: what they cost per embedding (docs/design.md §4b) and each multimodal request's
share (§4a)."""
from __future__ import annotations

from mmscope import stages
from mmscope.carry import ttft_split
from mmscope.emit.stage_timer import WORKER
from mmscope.vllm.engine_core.state import EngineState


def share_step(scheduler, state: EngineState | None, scheduler_output, sent) -> None:
    """The step's encoder time shared among the items it computed, its EC-load time among the
    items the connector loaded: into what they cost per embedding on this engine (each item's
    way, §4b) and the requests' shares of the step (§4a). A worker process sent exactly this
    step's durations (`sent`); one in this process left its step totals in WORKER."""
    in_process = WORKER.take_step() if WORKER.step_ns or WORKER.clock.pending else None
    computed = scheduler_output.scheduled_encoder_inputs
    if state is None or not (computed or state.ledger.loaded):
        return  # most steps: nothing was encoded or loaded
    step_ns = {k: sum(v) for k, v in sent.items()} if sent else (in_process or {})
    loaded = state.ledger.take_loaded()
    encoded = []  # (request id, modality, embeddings) of each item computed
    for request_id, input_ids in (computed or {}).items():
        request = scheduler.requests.get(request_id)
        if request is not None:
            encoded += [(request_id, f.modality, f.mm_position.get_num_embeds())
                        for f in (request.mm_features[i] for i in input_ids)]
    encoder_ns, load_ns = step_ns.get(stages.VIT_FORWARD, 0), step_ns.get(stages.EC_LOAD, 0)
    state.costs.encoded(encoder_ns, ((m, e) for _, m, e in encoded))
    state.costs.loaded(load_ns, ((item.modality, item.embeds) for item in loaded))
    shares = state.shares
    if not shares.open:
        return
    if encoded:
        weights: dict[str, int] = {}
        for request_id, _, embeds in encoded:
            weights[request_id] = weights.get(request_id, 0) + embeds
        for request_id, input_ids in computed.items():
            if request_id in weights:
                shares.computed(request_id, len(input_ids))
        shares.share(ttft_split.ENCODER, encoder_ns, weights)
    if loaded:
        weights = {}
        for item in loaded:
            weights[item.request_id] = weights.get(item.request_id, 0) + item.embeds
        shares.share(ttft_split.EC_LOAD, load_ns, weights)


def past_first_token(scheduler, request_id: str) -> bool:
    """The request has its first token (or is gone): its encoder work is over."""
    request = scheduler.requests.get(request_id)
    return request is None or request.num_output_tokens > 0
