"""API-server wrappers for each multimodal request's time to first token by part: its start and
end as vLLM's input and output processors see them, joined with EngineCore's shares (carry/ttft_split.py).
"""
from __future__ import annotations

import functools
import time

from mmscope.carry import ttft_split
from mmscope.log import logger
from mmscope.vllm.api_server import request_spans
from mmscope.vllm.api_server.media_items import RENDERS
from mmscope.vllm.engine_core.state import probe_enabled

JOIN = ttft_split.TtftJoin()
# The TTFT histograms of the newest PrometheusStatLogger (stat_loggers.py sets them): vLLM's
# __init__ unregisters every vllm:* collector, so only the newest is exposed; a plain list, not a
# weak mapping, since every multimodal request observes into it.
HISTOGRAMS: list = []


def request_id_assigned(hook, wrapped, instance, args, kwargs, request):
    """InputProcessor.assign_request_id runs once per request as it leaves for EngineCore, after
    the media, the chat template, the tokens and the multimodal processor: vLLM's arrival_time
    (taken before all of those) until now is the request's API processing, of which its
    render's media and processor wall times are parts (media_items.py)."""
    result = wrapped(*args, **kwargs)
    try:
        if request.mm_features:
            render = RENDERS.take(request.arrival_time)
            api_s = time.time() - request.arrival_time
            JOIN.assigned(request.request_id, ttft_split.ApiTimes(api_s) if render is None else
                          ttft_split.ApiTimes(api_s, render.media_s(), render.processor_s()))
    except Exception as e:  # noqa: BLE001 - ours: the hook turns off, vLLM goes on
        hook.failed(e)
    return result


def request_finished(hook, wrapped, output_processor, args, kwargs, req_state):
    """OutputProcessor._update_stats_from_finished: the request's RequestStateStats are final
    (vLLM's TTFT, queued, scheduled and first-token timestamps). Only with vLLM's stats on."""
    result = wrapped(*args, **kwargs)
    try:
        stats = req_state.stats
        if stats is not None and stats.first_token_ts and req_state.request_id in JOIN.api:
            JOIN.finished(req_state.request_id, ttft_split.FrontTimes(
                req_state.external_req_id, stats.first_token_latency,
                stats.scheduled_ts - stats.queued_ts, stats.first_token_ts - stats.scheduled_ts))
            if JOIN.ready:
                _emit(JOIN.drain())
    except Exception as e:  # noqa: BLE001
        hook.failed(e)
    return result


def engine_shares(shares: dict[str, dict[str, int]], engine_idx: int) -> None:
    """EngineCore's records from one stats update, joined in (called by the stat_loggers.record hook)."""
    JOIN.engine_shares(shares, engine_idx)
    _emit(JOIN.drain(), shares)


@functools.cache
def _probe() -> bool:
    return probe_enabled()


def _emit(splits: list[ttft_split.TtftSplit], records: dict | None = None) -> None:
    """Whole splits into the histograms as soon as they are whole (the engine may be idle after),
    and one probe line each with VLLM_MM_CACHE_PROBE=1; splits and EngineCore's records to the
    requests' spans where vLLM traces requests."""
    for histograms in HISTOGRAMS:
        for split in splits:
            histograms.observe(split)
    if _probe():
        for split in splits:
            logger.info(ttft_split.probe_line(split))
    if request_spans.SPANS is not None:
        request_spans.arrived(records or {}, splits)
