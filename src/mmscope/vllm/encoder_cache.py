"""What the EngineCore hooks observe: the scheduler's per-item encoder decisions, fed to the ledger.

The wrappers never change an argument or a return value; they only read them.
"""
from __future__ import annotations

import functools
import os
import threading
import time

from mmscope import access_log
from mmscope.accounting import Decision, EncoderCacheLedger, Item, probe_line
from mmscope.stage_timing import WORKER, merge
from mmscope.vllm.patching import HookState, logger, native_wrapper

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
        ledger.access_log = log_access
    return ledger


class _Probe(threading.local):
    """The request whose encoder inputs the scheduler is looking at right now, and what the
    cache manager answered for it. Per thread, as each scheduler steps on one thread; the probe
    wrapper sets `request` around vLLM's call (in C where built) and end_probe resets the rest."""

    def __init__(self):
        self.request = None
        self.local_hits: list[int] = []
        self.deferred: list[int] = []


PROBE = _Probe()


# --- Scheduler._try_schedule_encoder_inputs: one look at one request's items ------------------
def items_ahead(request, num_computed_tokens) -> bool:
    """Whether some multimodal item of the request is not yet behind the computed tokens."""
    features = request.mm_features
    if not features:
        return False
    last = features[-1].mm_position
    return num_computed_tokens < last.offset + last.length


def probe_gate(after):
    """A wrapper factory for the probe, opened only for requests with items ahead: vLLM calls
    this for every running request in every step, and for a request whose items are all behind
    it (every decode step) the wrapper should cost one check, not the probe's bookkeeping. For the
    others, PROBE.request names the request while vLLM's call runs, then `after(result, *args)`
    (result None when vLLM raised, whose exception passes through). In C where the extension is
    built (mode PROBE of _wrappers.c); the Python twin is the fallback and the reference."""

    def factory(original, state: HookState):
        @functools.wraps(original)
        def wrapper(scheduler, request, num_computed_tokens, *args, **kwargs):
            try:
                ahead = state.enabled and items_ahead(request, num_computed_tokens)
            except Exception as e:  # noqa: BLE001 - an unexpected request shape turns it off
                state.failed(e)
                ahead = False
            if not ahead:
                return original(scheduler, request, num_computed_tokens, *args, **kwargs)
            PROBE.request = request
            result = None
            try:
                result = original(scheduler, request, num_computed_tokens, *args, **kwargs)
                return result
            finally:
                PROBE.request = None
                if state.enabled:
                    try:
                        after(result, scheduler, request, num_computed_tokens, *args, **kwargs)
                    except Exception as e:  # noqa: BLE001
                        state.failed(e)

        native = native_wrapper(original, after, state, "PROBE", slow=wrapper, probe=PROBE)
        return native if native is not None else wrapper
    return factory


def end_probe(result, scheduler, request, *args, **kwargs) -> None:
    """After one look (result None when vLLM raised): the look's tentative decisions become the
    request's proposals for this step. Inline, with no helper frames: it runs for every request
    that has items ahead, on the scheduler's cold path."""
    probe = PROBE
    local_hits, deferred = probe.local_hits, probe.deferred
    if local_hits or deferred:
        probe.local_hits, probe.deferred = [], []
    manager = scheduler.encoder_cache_manager
    ledger = manager.__dict__.get(LEDGER) or ledger_of(manager)
    if result is None:  # vLLM raised; nothing was decided
        ledger.set_proposals(request.request_id, None)
        return
    to_compute, _num_new_tokens, _budget, external_load, duplicates = result
    if not (to_compute or external_load or duplicates or local_hits or deferred):
        ledger.set_proposals(request.request_id, None)
        return
    scheduler._mmscope_proposed = True  # schedule()'s guard (targets.py): a commit is due
    decisions = {}  # a later kind overrides an earlier one for the same item
    for indices, decision in ((local_hits, Decision.LOCAL_HIT), (deferred, Decision.DEFERRED),
                              (to_compute, Decision.COMPUTE), (external_load, Decision.CONNECTOR),
                              (duplicates, Decision.DUPLICATE)):
        for i in indices:
            decisions[i] = decision
    request_id, features = request.request_id, request.mm_features
    proposals = []
    for index in sorted(decisions):
        feature = features[index]
        # tuple.__new__: the NamedTuple's own __new__ would add a Python frame per item
        item = _new_tuple(Item, (request_id, index, feature.modality, feature.identifier,
                                 feature.mm_position.get_num_embeds()))
        proposals.append((item, decisions[index]))
    ledger.set_proposals(request_id, proposals)


_new_tuple = tuple.__new__


# --- EncoderCacheManager: tentative answers while a probe is open ----------------------------
def saw_cache_check(result, manager, request, input_id, *args, **kwargs) -> None:
    probe = PROBE
    if result and probe.request is request:  # not the duplicates' calls at allocation
        probe.local_hits.append(input_id)


def saw_can_allocate(result, manager, request, input_id, *args, **kwargs) -> None:
    probe = PROBE
    if not result and probe.request is request:
        probe.deferred.append(input_id)


def saw_free(manager, request, *args, **kwargs) -> None:
    ledger = manager.__dict__.get(LEDGER) or ledger_of(manager)
    ledger.forget(request.request_id)
    if ledger.access_log is not None:
        ledger.access_log.freed(request.request_id)


# --- Scheduler: commits and emission ----------------------------------------------------------
def saw_allocation(scheduler, request, input_ids, *args, **kwargs) -> None:
    scheduler._mmscope_proposed = True
    ledger = ledger_of(scheduler.encoder_cache_manager)
    for input_id in input_ids:
        ledger.allocated(request.mm_features[input_id].identifier)


def saw_schedule(output, scheduler, *args, **kwargs) -> None:
    """The step's outcome commits the proposals. Runs only on steps that proposed, allocated,
    computed or evicted something (its guard in targets.py); decode-only steps skip it."""
    scheduler._mmscope_proposed = False
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
