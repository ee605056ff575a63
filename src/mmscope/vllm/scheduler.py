"""EngineCore's wrappers: the scheduler's per-item encoder decisions, fed to the ledger, and the
counts handed to the step's SchedulerStats. They never change an argument or a return value.
"""
from __future__ import annotations

import functools
import os
import time
import weakref

from mmscope import stages
from mmscope.carry import access_log, ttft
from mmscope.carry.ledger import Decision, EncoderCacheLedger, Item, probe_line
from mmscope.emit.stage_timer import WORKER, merge
from mmscope.log import logger
from mmscope.vllm import ec_connector
from mmscope.vllm.ec_connector import TRANSFERS
from mmscope.vllm.patching import failed

PROBE_ENV = "VLLM_MM_CACHE_PROBE"
# While the engine is busy, the counts and the worker's stage durations travel at most this often
# (Prometheus scrapes every 5-60 s, vLLM's log line comes every 10 s); when it runs dry, at once.
SEND_EVERY_S = 1.0
# The attribute a worker in another process sets on its ModelRunnerOutput (worker.py): the output
# is pickled whole between processes, so an attribute rides along.
SENT_DURATIONS = "_mmscope_stage_durations"


def probe_enabled() -> bool:
    return os.environ.get(PROBE_ENV, "0").strip().lower() not in ("", "0", "false", "no")


class EngineState:
    """What mmscope keeps per EncoderCacheManager (one per scheduler): the ledger, the stage
    durations a worker process sent, when the counts last went out."""

    def __init__(self, manager):
        log_access = access_log.writer()
        if log_access is not None:
            log_access.capacity(manager.cache_size)
        self.access_log = log_access
        self.ledger = EncoderCacheLedger(probe=_sink(probe_enabled(), log_access))
        self.worker_durations: dict[str, list[int]] = {}
        self.shares = ttft.EngineShares()  # each multimodal request's encoder and EC-load time
        self.split_ttft = ttft.enabled()  # no request is admitted to the shares otherwise
        self.sent = float("-inf")


# Keyed weakly, so that mmscope never adds attributes to vLLM's objects nor keeps them alive.
_states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def state_of(manager) -> EngineState:
    state = _states.get(manager)
    if state is None:
        state = _states[manager] = EngineState(manager)
    return state


def _sink(log_probe: bool, log_access):
    """Where committed decisions go: probe lines, the access log, both, or nowhere."""
    def probe(outcome, item, source):
        logger.info(probe_line(outcome, item, source))

    if log_probe and log_access:
        def both(outcome, item, source):
            probe(outcome, item, source)
            log_access.item(outcome, item, source)
        return both
    if log_access:
        return log_access.item
    return probe if log_probe else None


def _item(request, index: int) -> Item:
    feature = request.mm_features[index]
    return Item(request.request_id, index, feature.modality, feature.identifier,
                feature.mm_position.get_num_embeds())


# --- EncoderCacheManager: the scheduler's look at each item in a request's token window --------
# Scheduler._try_schedule_encoder_inputs asks about every item in the window: check_and_update_cache
# (resident?), then can_allocate (room and budget?). vLLM passes (request, input_id) positionally.
def cache_checked(wrapped, manager, args, kwargs):
    hit = wrapped(*args, **kwargs)
    if hit:  # resident: a local hit, unless the item is a duplicate (ledger.propose)
        try:
            state_of(manager).ledger.propose(_item(*args[:2]), Decision.LOCAL_HIT)
        except Exception as e:  # noqa: BLE001 - ours: the hook turns off, vLLM goes on
            failed("encoder_cache.local_hit", e)
    return hit


def allocation_checked(wrapped, manager, args, kwargs):
    room = wrapped(*args, **kwargs)
    if not room:  # no room or budget: the scheduler stops before this item
        try:
            state_of(manager).ledger.propose(_item(*args[:2]), Decision.DEFERRED)
        except Exception as e:  # noqa: BLE001
            failed("encoder_cache.deferral", e)
    return room


def entries_freed(wrapped, manager, args, kwargs):
    try:
        state = state_of(manager)
        request_id = args[0].request_id
        state.ledger.forget(request_id)
        if state.access_log is not None:
            state.access_log.freed(request_id)
    except Exception as e:  # noqa: BLE001
        failed("encoder_cache.free", e)
    return wrapped(*args, **kwargs)


# --- Scheduler: allocation, commit, emission ---------------------------------------------------
def inputs_allocated(wrapped, scheduler, args, kwargs):
    """A request the scheduler schedules: space for the items it computes or loads (input_ids),
    and the later copies of an item it computes in this step (duplicate_input_ids)."""
    try:
        request, input_ids, duplicate_input_ids = args[:3]
        ledger = state_of(scheduler.encoder_cache_manager).ledger
        # Without a connector every reserved item is computed; with one, the step's computed
        # items tell the two apart at the commit.
        reserved = Decision.COMPUTE if scheduler.ec_connector is None else Decision.ALLOCATED
        for input_id in input_ids:
            item = _item(request, input_id)
            ledger.allocated(item.key)
            ledger.propose(item, reserved)
        for input_id in duplicate_input_ids:
            ledger.propose(_item(request, input_id), Decision.DUPLICATE)
    except Exception as e:  # noqa: BLE001
        failed("scheduler.allocate", e)
    return wrapped(*args, **kwargs)


def step_scheduled(wrapped, scheduler, args, kwargs):
    """The step's outcome commits the proposals. Decode-only steps proposed, computed, freed and
    admitted nothing: they skip the commit."""
    output = wrapped(*args, **kwargs)
    manager = scheduler.encoder_cache_manager
    state = _states.get(manager)
    if (output.scheduled_encoder_inputs or output.free_encoder_mm_hashes
            or output.scheduled_new_reqs or output.scheduled_cached_reqs.resumed_req_ids
            or (state is not None and state.ledger.proposals)):
        try:
            _commit(scheduler, manager, output)
        except Exception as e:  # noqa: BLE001
            failed("scheduler.commit", e)
    return output


def _commit(scheduler, manager, output) -> None:
    state = state_of(manager)
    ledger = state.ledger
    if state.split_ttft:
        for new in output.scheduled_new_reqs:
            if new.mm_features:
                state.shares.admit(new.req_id)
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
    if cached.resumed_req_ids:
        starts += [(rid, n) for rid, n in zip(cached.req_ids, cached.num_computed_tokens)
                   if rid in cached.resumed_req_ids]
    for request_id, computed in starts:
        request = scheduler.requests.get(request_id)
        if not computed or request is None or not request.mm_features:
            continue
        for index, feature in enumerate(request.mm_features):
            position = feature.mm_position
            if position.offset + position.length <= computed:
                ledger.prefix_covered(_item(request, index))


@functools.cache
def _evicts_for_room(manager_cls) -> bool:
    from vllm.v1.core.encoder_cache_manager import EncoderCacheManager

    return manager_cls.get_freed_mm_hashes is EncoderCacheManager.get_freed_mm_hashes


def scheduler_created(wrapped, scheduler, args, kwargs):
    """A worker in the scheduler's process (vLLM's default executor) leaves its stage durations
    in WORKER for stats_attached to take; only workers in other processes send them on outputs."""
    result = wrapped(*args, **kwargs)
    try:
        WORKER.collected_in_process = True
        state_of(scheduler.encoder_cache_manager)  # the access log's capacity line, at start
    except Exception as e:  # noqa: BLE001
        failed("scheduler.created", e)
    return result


def stats_attached(wrapped, scheduler, args, kwargs):
    """Hand the counts and the worker's stage durations to the one EngineCoreOutputs that carries
    this step's SchedulerStats; without one they wait. At most every SEND_EVERY_S while busy,
    at once when the scheduler runs dry; a worker process' durations are kept whenever they come.
    The step's encoder and EC-load time is shared out first: vLLM's update frees the requests
    that finish in this step."""
    runner_output = args[1] if len(args) > 1 else kwargs.get("model_runner_output")
    sent = getattr(runner_output, SENT_DURATIONS, None)
    state = _states.get(scheduler.encoder_cache_manager)
    try:
        _share_step(scheduler, state, args[0] if args else kwargs["scheduler_output"], sent)
    except Exception as e:  # noqa: BLE001
        failed("scheduler.emit_stats", e)
    outputs = wrapped(*args, **kwargs)
    if state is None and not sent and not WORKER.pending:
        return outputs  # nothing multimodal happened in this engine yet
    try:
        if state is None:
            state = state_of(scheduler.encoder_cache_manager)
        if sent:
            merge(state.worker_durations, sent)
        ec_connector.received(runner_output)
        now = time.monotonic()
        if now - state.sent >= SEND_EVERY_S or not scheduler.has_unfinished_requests():
            # Requests past their first token are done with the encoder: checked only as often
            # as the counts go out, not every step.
            if state.shares.open:
                state.shares.close(lambda request_id: _past_first_token(scheduler, request_id))
            _attach(state, outputs, now)
    except Exception as e:  # noqa: BLE001
        failed("scheduler.emit_stats", e)
    return outputs


def _past_first_token(scheduler, request_id: str) -> bool:
    request = scheduler.requests.get(request_id)
    return request is None or request.num_output_tokens > 0


def _share_step(scheduler, state: EngineState | None, scheduler_output, sent) -> None:
    """The step's encoder time shared among the items it computed, its EC-load time among the
    items the connector loaded, by embeddings. A worker process sent exactly this step's
    durations; one in this process left its step totals in WORKER."""
    in_process = WORKER.take_step() if WORKER.step_ns else None  # taken every step: one step's
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
        shares.share(ttft.ENCODER, step_ns.get(stages.VIT_FORWARD, 0), weights)
    if loaded:
        weights = {}
        for item in loaded:
            weights[item.request_id] = weights.get(item.request_id, 0) + item.embeds
        shares.share(ttft.EC_LOAD, step_ns.get(stages.EC_LOAD, 0), weights)


def _attach(state: EngineState, outputs, now: float) -> None:
    ledger = state.ledger
    news = ledger.has_news
    durations = WORKER.pending or state.worker_durations
    if not (news or durations or state.shares.done or TRANSFERS.pending):
        return
    for eco in (outputs or {}).values():
        stats = eco.scheduler_stats
        if stats is not None:
            if news:
                stats.encoder_cache_stats = ledger.drain().to_wire()
            if durations:
                stats.mm_stage_durations = merge(state.worker_durations, WORKER.drain())
                state.worker_durations = {}
            if state.shares.done:
                stats.mm_request_shares = state.shares.drain()
            if TRANSFERS.pending:
                stats.mm_ec_transfers = TRANSFERS.drain()
            state.sent = now
            return
