"""What the EngineCore hooks observe: the scheduler's per-item encoder decisions, fed to the ledger.

The wrappers never change an argument or a return value; they only read them.
"""
from __future__ import annotations

import functools
import os
import time

from mmscope.carry import access_log
from mmscope.carry.ledger import Decision, EncoderCacheLedger, Item, probe_line
from mmscope.emit.stage_timer import WORKER, merge
from mmscope.vllm.patching import logger

PROBE_ENV = "VLLM_MM_CACHE_PROBE"
# While the engine is busy, the counts and the worker's stage durations travel at most this often
# (Prometheus scrapes every 5-60 s, vLLM's log line comes every 10 s); when it runs dry, at once.
# Each emission costs a few hundred microseconds in place (cold caches), so not more often.
SEND_EVERY_S = 1.0


def probe_enabled() -> bool:
    return os.environ.get(PROBE_ENV, "0").strip().lower() not in ("", "0", "false", "no")


def _log_probe(outcome: str, item: Item, source: str | None) -> None:
    logger.info(probe_line(outcome, item, source))


def _sink(log_probe: bool, log_access):
    """Where committed decisions go: probe lines, the access log, both, or nowhere."""
    if log_probe and log_access:
        def both(outcome, item, source):
            _log_probe(outcome, item, source)
            log_access.item(outcome, item, source)
        return both
    if log_access:
        return log_access.item
    return _log_probe if log_probe else None


LEDGER = "_mmscope_ledger"  # the attribute of vLLM's EncoderCacheManager that holds our ledger
# ...and the one that holds the ledger's pending proposals: schedule()'s guard (targets.py) reads
# its truth in C, so a step that looked at no item runs no commit.
PROPOSALS = "_mmscope_proposals"


def ledger_of(manager) -> EncoderCacheLedger:
    """The ledger lives on vLLM's EncoderCacheManager: one per scheduler, created on first use.
    (Per-request observers read manager.__dict__[LEDGER] first, inline: one frame less.)"""
    ledger = manager.__dict__.get(LEDGER)
    if ledger is None:
        log_access = access_log.writer()
        if log_access is not None:
            log_access.capacity(manager.cache_size)
        ledger = EncoderCacheLedger(probe=_sink(probe_enabled(), log_access))
        setattr(manager, LEDGER, ledger)
        setattr(manager, PROPOSALS, ledger.proposals)
        ledger.access_log = log_access
    return ledger


# --- EncoderCacheManager: the scheduler's look at each item in a request's token window --------
# vLLM's Scheduler._try_schedule_encoder_inputs asks the cache manager about every item in the
# window: check_and_update_cache (resident?), then can_allocate (room and budget?). Those calls
# only happen for items ahead of the computed tokens, so decode steps cost nothing here; wrapping
# the scheduler's method itself meant a check on every running request in every step.
def _item(request, index: int) -> Item:
    feature = request.mm_features[index]
    # tuple.__new__: the NamedTuple's own __new__ would add a Python frame per item
    return _new_tuple(Item, (request.request_id, index, feature.modality, feature.identifier,
                             feature.mm_position.get_num_embeds()))


_new_tuple = tuple.__new__


# Their guards (targets.py) keep the Python call off the common answer: a miss, room to allocate.
def saw_cache_check(result, manager, request, input_id, *args, **kwargs) -> None:
    if result:  # resident: a local hit, unless the item is a duplicate (ledger.propose)
        ledger = manager.__dict__.get(LEDGER) or ledger_of(manager)
        ledger.propose(_item(request, input_id), Decision.LOCAL_HIT)


def saw_can_allocate(result, manager, request, input_id, *args, **kwargs) -> None:
    if not result:  # no room or budget: the scheduler stops before this item
        ledger = manager.__dict__.get(LEDGER) or ledger_of(manager)
        ledger.propose(_item(request, input_id), Decision.DEFERRED)


def saw_free(manager, request, *args, **kwargs) -> None:
    ledger = manager.__dict__.get(LEDGER) or ledger_of(manager)
    ledger.forget(request.request_id)
    if ledger.access_log is not None:
        ledger.access_log.freed(request.request_id)


# --- Scheduler: commits and emission ----------------------------------------------------------
def saw_allocation(scheduler, request, input_ids, duplicate_input_ids=(), *args, **kwargs) -> None:
    """A request the scheduler schedules: space for the items it computes or loads (input_ids),
    and the later copies of an item it computes in this step (duplicate_input_ids)."""
    manager = scheduler.encoder_cache_manager
    ledger = manager.__dict__.get(LEDGER) or ledger_of(manager)
    # Without a connector every reserved item is computed; with one, the step's computed items
    # tell the two apart at the commit.
    reserved = (Decision.COMPUTE if getattr(scheduler, "ec_connector", None) is None
                else Decision.ALLOCATED)
    for input_id in input_ids:
        item = _item(request, input_id)
        ledger.allocated(item.key)
        ledger.propose(item, reserved)
    for input_id in duplicate_input_ids:
        ledger.propose(_item(request, input_id), Decision.DUPLICATE)


def saw_schedule(output, scheduler, *args, **kwargs) -> None:
    """The step's outcome commits the proposals. Runs only on steps that proposed, allocated,
    computed or evicted something (its guard in targets.py); decode-only steps skip it."""
    manager = scheduler.encoder_cache_manager
    ledger = ledger_of(manager)
    ledger.commit_step(output.num_scheduled_tokens, output.scheduled_encoder_inputs)
    # The entries schedule() evicted for room this step (get_freed_mm_hashes() drains them into
    # the output); read here rather than by one more hook per step.
    freed = getattr(output, "free_encoder_mm_hashes", None)  # a missing field costs evictions only
    if freed and _evicts_for_room(type(manager)):
        ledger.evicted(len(freed))
    ledger.occupancy(manager.cache_size - manager.num_free_slots, manager.cache_size)


@functools.cache
def _evicts_for_room(manager_cls) -> bool:
    """Whether freed hashes are evictions: not for encoder-decoder models, whose manager frees
    every entry after use (it overrides get_freed_mm_hashes for that)."""
    from vllm.v1.core.encoder_cache_manager import EncoderCacheManager

    return manager_cls.get_freed_mm_hashes is EncoderCacheManager.get_freed_mm_hashes


def scheduler_created(result, scheduler, *args, **kwargs) -> None:
    """A worker in the scheduler's process (vLLM's default executor) leaves its stage durations
    in WORKER for attach_stats to take; only workers in other processes send them on outputs."""
    WORKER.collected_in_process = True


def attach_stats(outputs, scheduler, scheduler_output=None, model_runner_output=None,
                 *args, **kwargs) -> None:
    """Hand the counts, and the worker's stage durations, to the one EngineCoreOutputs that
    carries this step's SchedulerStats; without one they wait for the next. Runs every
    SEND_EVERY_S and when the scheduler runs dry (its guard in targets.py), so that the counters
    and histograms cost a few updates a second rather than some per step, and nothing waits for
    a next request; and whenever a worker in another process sent durations, to keep them."""
    sd = scheduler.__dict__
    sent = getattr(model_runner_output, "_mmscope_stage_durations", None)  # another process'
    if sent:
        merge(sd.setdefault("_mmscope_stage_durations", {}), sent)
    ledger = scheduler.encoder_cache_manager.__dict__.get(LEDGER)
    news = ledger is not None and ledger.has_news
    stages = WORKER.pending or sd.get("_mmscope_stage_durations")
    if not (news or stages) or (sent and not _send_due(scheduler)):
        return
    for eco in (outputs or {}).values():
        stats = eco.scheduler_stats
        if stats is not None:
            if news:
                stats.encoder_cache_stats = ledger.drain().to_wire()
            if stages:
                stats.mm_stage_durations = merge(sd.pop("_mmscope_stage_durations", {}),
                                                 WORKER.drain())
            sd["_mmscope_sent"] = time.monotonic()
            return


def _send_due(scheduler) -> bool:
    """For a call made to keep a worker process' durations: whether to send now anyway."""
    return (time.monotonic() - scheduler.__dict__.get("_mmscope_sent", 0.0) >= SEND_EVERY_S
            or not scheduler.has_unfinished_requests())
