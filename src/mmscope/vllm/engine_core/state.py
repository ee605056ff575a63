"""What mmscope keeps per scheduler in EngineCore: the encoder-cache ledger, its sinks (probe lines,
access log), the requests' TTFT shares and the worker durations received, keyed weakly by vLLM's
EncoderCacheManager (one per scheduler)."""
from __future__ import annotations

import weakref

from mmscope.carry import access_log, request_facts, ttft_split
from mmscope.carry.ledger import EncoderCacheLedger, Item, probe_line
from mmscope.flags import flag
from mmscope.log import logger
from mmscope.vllm.encoder_outputs import bytes_per_embedding

PROBE_ENV = "VLLM_MM_CACHE_PROBE"


def probe_enabled() -> bool:
    return flag(PROBE_ENV)


class EngineState:
    """The ledger, the stage durations a worker process sent, when the counts last went out."""

    def __init__(self, manager, bytes_per_embed: int = 0):
        log_access = access_log.writer()
        if log_access is not None:
            log_access.capacity(manager.cache_size, bytes_per_embed)
        self.access_log = log_access
        self.ledger = EncoderCacheLedger(probe=_sink(probe_enabled(), log_access))
        self.worker_durations: dict[str, list[int]] = {}
        self.shares = ttft_split.EngineShares()  # each multimodal request's encoder and EC-load time
        self.split_ttft = ttft_split.enabled()  # no request is admitted to the shares otherwise
        self.traced = False  # vLLM traces requests: each one's record carries its facts too
        self.sent = float("-inf")

    def trace_requests(self) -> None:
        """vLLM exports a span per request (--otlp-traces-endpoint): each multimodal request's
        record also tallies its items and outcomes, and goes out once it has its first token
        (docs/design.md §5a)."""
        self.traced = True
        self.shares.extra = request_facts.zeros()
        shares = self.shares

        def tally(outcome, item, source):
            request_facts.tally(shares.record(item.request_id), outcome, item, source)

        self.ledger.probe = _sink(probe_enabled(), self.access_log, tally)


# Keyed weakly: the state lives as long as vLLM's manager and never keeps it alive.
_states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


# The manager looked up last and its state: an engine has one, looked up several times a step,
# and a WeakKeyDictionary lookup makes a weak reference each time.
_last: tuple = (lambda: None, None)


def state_of(manager, model_config=None) -> EngineState:
    """The manager's state, made on first use; with the model's config (at the scheduler's start)
    the access log's capacity line also gives the bytes of one embedding."""
    state = existing(manager)
    if state is None:
        per_embed = bytes_per_embedding(model_config) if model_config is not None else 0
        state = _states[manager] = EngineState(manager, per_embed)
    return state


def existing(manager) -> EngineState | None:
    """The manager's state if anything multimodal happened in its engine yet."""
    global _last
    last_manager, state = _last
    if last_manager() is manager:
        return state
    state = _states.get(manager)
    if state is not None:
        _last = (weakref.ref(manager), state)
    return state


def _sink(log_probe: bool, log_access, tally=None):
    """Where committed decisions go: probe lines, the access log, the requests' records, any of
    them or nowhere."""
    def probe(outcome, item, source):
        logger.info(probe_line(outcome, item, source))

    sinks = [s for s in (probe if log_probe else None, log_access.item if log_access else None,
                         tally) if s is not None]
    if len(sinks) < 2:
        return sinks[0] if sinks else None

    def every(outcome, item, source):
        for sink in sinks:
            sink(outcome, item, source)
    return every


def item_of(request, index: int) -> Item:
    """Item `index` of a vLLM request, as the ledger counts it."""
    feature = request.mm_features[index]
    return Item(request.request_id, index, feature.modality, feature.identifier,
                feature.mm_position.get_num_embeds())
