"""What mmscope keeps per scheduler in EngineCore: the encoder-cache ledger, its sinks (probe lines,
access log), the requests' TTFT shares and the worker durations received, keyed weakly by vLLM's
EncoderCacheManager (one per scheduler)."""
from __future__ import annotations

import os
import weakref

from mmscope.carry import access_log, ttft
from mmscope.carry.ledger import EncoderCacheLedger, Item, probe_line
from mmscope.log import logger
from mmscope.vllm.encoder_outputs import bytes_per_embedding

PROBE_ENV = "VLLM_MM_CACHE_PROBE"


def probe_enabled() -> bool:
    return os.environ.get(PROBE_ENV, "0").strip().lower() not in ("", "0", "false", "no")


class EngineState:
    """The ledger, the stage durations a worker process sent, when the counts last went out."""

    def __init__(self, manager, bytes_per_embed: int = 0):
        log_access = access_log.writer()
        if log_access is not None:
            log_access.capacity(manager.cache_size, bytes_per_embed)
        self.access_log = log_access
        self.ledger = EncoderCacheLedger(probe=_sink(probe_enabled(), log_access))
        self.worker_durations: dict[str, list[int]] = {}
        self.shares = ttft.EngineShares()  # each multimodal request's encoder and EC-load time
        self.split_ttft = ttft.enabled()  # no request is admitted to the shares otherwise
        self.sent = float("-inf")


# Keyed weakly: the state lives as long as vLLM's manager and never keeps it alive.
_states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def state_of(manager, model_config=None) -> EngineState:
    """The manager's state, made on first use; with the model's config (at the scheduler's start)
    the access log's capacity line also gives the bytes of one embedding."""
    state = _states.get(manager)
    if state is None:
        per_embed = bytes_per_embedding(model_config) if model_config is not None else 0
        state = _states[manager] = EngineState(manager, per_embed)
    return state


def existing(manager) -> EngineState | None:
    """The manager's state if anything multimodal happened in its engine yet."""
    return _states.get(manager)


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


def item_of(request, index: int) -> Item:
    """Item `index` of a vLLM request, as the ledger counts it."""
    feature = request.mm_features[index]
    return Item(request.request_id, index, feature.modality, feature.identifier,
                feature.mm_position.get_num_embeds())
