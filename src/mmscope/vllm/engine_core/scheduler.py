"""EngineCore's wrappers on the scheduler and its EncoderCacheManager: each per-item encoder
decision fed to the ledger, and committed once the step's outcome is known (docs/design.md §4).
"""
from __future__ import annotations

import functools

from mmscope.carry import request_facts
from mmscope.carry.ledger import Decision
from mmscope.emit.stage_timer import WORKER
from mmscope.vllm.engine_core.state import existing, item_of, state_of


# --- EncoderCacheManager: the scheduler's look at each item in a request's token window --------
# Scheduler._try_schedule_encoder_inputs asks about every item in the window: check_and_update_cache
# (resident?), then can_allocate (room and budget?). vLLM passes (request, input_id) positionally.
def cache_checked(hook, wrapped, manager, args, kwargs, request, input_id):
    hit = wrapped(*args, **kwargs)
    if hit:  # resident: a local hit, unless the item is a duplicate (ledger.propose)
        try:
            state_of(manager).ledger.propose(item_of(request, input_id), Decision.LOCAL_HIT)
        except Exception as e:  # noqa: BLE001 - ours: the hook turns off, vLLM goes on
            hook.failed(e)
    return hit


def allocation_checked(hook, wrapped, manager, args, kwargs, request, input_id):
    room = wrapped(*args, **kwargs)
    if not room:  # no room or budget: the scheduler stops before this item
        try:
            state_of(manager).ledger.propose(item_of(request, input_id), Decision.DEFERRED)
        except Exception as e:  # noqa: BLE001
            hook.failed(e)
    return room


def entries_freed(hook, wrapped, manager, args, kwargs, request):
    try:
        state = state_of(manager)
        state.ledger.forget(request.request_id)
        if state.access_log is not None:
            state.access_log.freed(request.request_id)
    except Exception as e:  # noqa: BLE001
        hook.failed(e)
    return wrapped(*args, **kwargs)


# --- Scheduler: allocation and commit ----------------------------------------------------------
def inputs_allocated(hook, wrapped, scheduler, args, kwargs, request, input_ids,
                     duplicate_input_ids):
    """A request the scheduler schedules: space for the items it computes or loads (input_ids),
    and the later copies of an item it computes in this step (duplicate_input_ids)."""
    try:
        ledger = state_of(scheduler.encoder_cache_manager).ledger
        # Without a connector every reserved item is computed; with one, the step's computed
        # items tell the two apart at the commit.
        reserved = Decision.COMPUTE if scheduler.ec_connector is None else Decision.ALLOCATED
        for input_id in input_ids:
            item = item_of(request, input_id)
            ledger.allocated(item.key)
            ledger.propose(item, reserved)
        for input_id in duplicate_input_ids:
            ledger.propose(item_of(request, input_id), Decision.DUPLICATE)
    except Exception as e:  # noqa: BLE001
        hook.failed(e)
    return wrapped(*args, **kwargs)


def step_scheduled(hook, wrapped, scheduler, args, kwargs):
    """The step's outcome commits the proposals. Decode-only steps proposed, computed, freed and
    admitted nothing: they skip the commit."""
    output = wrapped(*args, **kwargs)
    manager = scheduler.encoder_cache_manager
    state = existing(manager)
    if (output.scheduled_encoder_inputs or output.free_encoder_mm_hashes
            or output.scheduled_new_reqs or _resumed(output.scheduled_cached_reqs)
            or (state is not None and state.ledger.proposals)):
        try:
            _commit(scheduler, manager, output)
        except Exception as e:  # noqa: BLE001
            hook.failed(e)
    return output


def _resumed(cached) -> set[str]:
    """Requests resumed after preemption that vLLM sends as cached ones: up to 0.33 with Model
    Runner V1 (`resumed_req_ids`); vLLM 0.34 sends every resumed request in full, as a new one."""
    return getattr(cached, "resumed_req_ids", None) or ()


def _commit(scheduler, manager, output) -> None:
    state = state_of(manager)
    ledger = state.ledger
    if state.split_ttft or state.traced:
        for new in output.scheduled_new_reqs:
            if new.mm_features:
                items = (request_facts.items(f.modality for f in new.mm_features)
                         if state.traced else None)
                state.shares.admit(new.req_id, items)
    if not scheduler.is_encoder_decoder:  # their items sit at position 0: never prefix-covered
        _prefix_covered(scheduler, ledger, output)
    ledger.commit_step(output.num_scheduled_tokens, output.scheduled_encoder_inputs)
    # Entries schedule() evicted for room this step (get_freed_mm_hashes() drains them into the
    # output); not evictions for encoder-decoder models, whose manager frees every entry after use.
    if output.free_encoder_mm_hashes and _evicts_for_room(type(manager)):
        ledger.evicted(len(output.free_encoder_mm_hashes))
    ledger.occupancy(manager.cache_size - manager.num_free_slots, manager.cache_size)


def _prefix_covered(scheduler, ledger, output) -> None:
    """Items of newly scheduled (or resumed) requests whose placeholder tokens all lie in the
    tokens computed before this step (prefix-cache hits): vLLM's window never reaches them, the
    same test as vLLM's strip_covered_mm_data."""
    cached = output.scheduled_cached_reqs
    starts = [(r.req_id, r.num_computed_tokens) for r in output.scheduled_new_reqs]
    resumed = _resumed(cached)
    if resumed:
        starts += [(rid, n) for rid, n in zip(cached.req_ids, cached.num_computed_tokens)
                   if rid in resumed]
    for request_id, computed in starts:
        request = scheduler.requests.get(request_id)
        if not computed or request is None or not request.mm_features:
            continue
        for index, feature in enumerate(request.mm_features):
            position = feature.mm_position
            if position.offset + position.length <= computed:
                ledger.prefix_covered(item_of(request, index))


@functools.cache
def _evicts_for_room(manager_cls) -> bool:
    from vllm.v1.core.encoder_cache_manager import EncoderCacheManager

    return manager_cls.get_freed_mm_hashes is EncoderCacheManager.get_freed_mm_hashes


def scheduler_created(hook, wrapped, scheduler, args, kwargs):
    """A worker in the scheduler's process (vLLM's default executor) leaves its stage durations
    in WORKER for the stats hook to take; only workers in other processes send them on outputs.
    Where vLLM traces requests, each multimodal request's record tallies its facts too."""
    result = wrapped(*args, **kwargs)
    try:
        WORKER.collected_in_process = True
        # the access log's capacity line, at start
        state = state_of(scheduler.encoder_cache_manager, scheduler.vllm_config.model_config)
        if scheduler.observability_config.otlp_traces_endpoint:
            state.trace_requests()
    except Exception as e:  # noqa: BLE001
        hook.failed(e)
    return result
