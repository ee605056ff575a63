"""EngineCore: the ledger's counts, the worker's stage durations, the EC transfers, the requests'
TTFT shares and the hooks turned off handed to the step's SchedulerStats, which vLLM carries to
the API server (wire/scheduler_stats.py)."""
from __future__ import annotations

import time

from mmscope.carry.transfers import TRANSFERS
from mmscope.emit.stage_timer import WORKER, merge
from mmscope.vllm.engine_core import step_shares
from mmscope.vllm.engine_core.state import EngineState, existing, state_of
from mmscope.vllm.patching import TURNED_OFF
from mmscope.vllm.wire import runner_output

# While the engine is busy, the counts and the worker's stage durations travel at most this often
# (Prometheus scrapes every 5-60 s, vLLM's log line comes every 10 s); when it runs dry, at once.
SEND_EVERY_S = 1.0


def stats_attached(hook, wrapped, scheduler, args, kwargs, scheduler_output, model_runner_output):
    """Scheduler.update_from_output: hand what is due to the one EngineCoreOutputs that carries
    this step's SchedulerStats; without one it waits. At most every SEND_EVERY_S while busy, at
    once when the scheduler runs dry; a worker process' durations are kept whenever they come.
    The step's encoder and EC-load time is shared out first: vLLM's update frees the requests
    that finish in this step."""
    sent = _received(model_runner_output)
    state = existing(scheduler.encoder_cache_manager)
    try:
        step_shares.share_step(scheduler, state, scheduler_output, sent)
    except Exception as e:  # noqa: BLE001
        hook.failed(e)
    outputs = wrapped(*args, **kwargs)
    if (state is None and not sent and not WORKER.pending and not TRANSFERS.pending
            and not TURNED_OFF.unsent):
        return outputs  # nothing multimodal happened in this engine yet
    try:
        if state is None:
            state = state_of(scheduler.encoder_cache_manager)
        if sent:
            merge(state.worker_durations, sent)
        now = time.monotonic()
        due = now - state.sent >= SEND_EVERY_S or not scheduler.has_unfinished_requests()
        # Requests past their first token are done with the encoder: checked only as often as
        # the counts go out, or every step where vLLM traces requests, whose spans wait for
        # their records (docs/design.md §5a).
        if state.shares.open and (due or state.traced):
            state.shares.close(lambda rid: step_shares.past_first_token(scheduler, rid))
        if due:
            _attach(state, outputs, now)
        elif state.shares.done:
            stats = _step_stats(outputs)
            if stats is not None:
                stats.mm_request_shares = state.shares.drain()
    except Exception as e:  # noqa: BLE001
        hook.failed(e)
    return outputs


def _received(model_runner_output) -> dict[str, list[int]] | None:
    """The durations a worker process attached to this step's output; its transfers join this
    process's TRANSFERS, its hooks turned off this process's TURNED_OFF."""
    durations, transfers, hooks_off = runner_output.take(model_runner_output)
    if transfers:
        TRANSFERS.merge(transfers)
    if hooks_off:
        TURNED_OFF.merge(hooks_off)
    return durations


def _step_stats(outputs):
    """The step's SchedulerStats, on the one EngineCoreOutputs that carries them (or None)."""
    for eco in (outputs or {}).values():
        if eco.scheduler_stats is not None:
            return eco.scheduler_stats
    return None


def _attach(state: EngineState, outputs, now: float) -> None:
    ledger = state.ledger
    news = ledger.has_news
    durations = WORKER.pending or state.worker_durations
    if not (news or durations or state.shares.done or TRANSFERS.pending or TURNED_OFF.unsent):
        return
    stats = _step_stats(outputs)
    if stats is None:
        return
    if news:
        stats.encoder_cache_stats = ledger.drain().to_wire()
    if durations:
        stats.mm_stage_durations = merge(state.worker_durations, WORKER.drain())
        state.worker_durations = {}
    if state.shares.done:
        stats.mm_request_shares = state.shares.drain()
    if TRANSFERS.pending:
        stats.mm_ec_transfers = TRANSFERS.drain()
    if TURNED_OFF.unsent:
        stats.mm_hooks_off = TURNED_OFF.drain()
    state.sent = now
