"""API-server wrappers of the media before the processor: each item's fetch and decode (the
`mm:media:*` stages, docs/design.md §3), its bytes and failures, and each render's items and
processor time, for the TTFT split (§4a) and the fetches the processor cache made pointless (§5).
"""
from __future__ import annotations

import contextvars
import functools
import os
import time
from collections import OrderedDict

from mmscope import stages
from mmscope.carry import media_loads
from mmscope.emit import tracing
from mmscope.emit.stage_timer import ENABLED, FRONTEND
from mmscope.vllm.patching import Status, When

COUNTS = media_loads.MediaCounts()
LOOKUPS = media_loads.Lookups()
# The render running in this task (its items load in tasks it starts, which copy the context).
CURRENT: contextvars.ContextVar[media_loads.Render | None] = contextvars.ContextVar(
    "mmscope_render", default=None)
# Items being loaded, by their media IO object: vLLM makes one per item and hands it to the
# decode, which runs on a media thread where the task's context is not.
_loading: dict[int, media_loads.Item] = {}
# The row that admits requests to the TTFT split: renders wait for it by arrival time only then.
ASSIGN_ROW = "request_times.assigned"
LOOKUP_ROW = "media.cache_lookup"  # one of the rows applied once media come by URL


class Renders:
    """Renders by vLLM's arrival time, which each of their requests carries to the API server's
    exit (request_times); a render's requests share it. Bounded as the split's halves are."""

    def __init__(self):
        self.by_arrival: OrderedDict[float, media_loads.Render] = OrderedDict()

    def add(self, arrival_time: float, render: media_loads.Render) -> None:
        if self.by_arrival.get(arrival_time) is not render:
            self.by_arrival[arrival_time] = render
            if len(self.by_arrival) > media_loads.MAX_PENDING:
                self.by_arrival.popitem(last=False)
        render.requests += 1

    def take(self, arrival_time: float) -> media_loads.Render | None:
        render = self.by_arrival.get(arrival_time)
        if render is not None:
            render.requests -= 1
            if render.requests <= 0:
                del self.by_arrival[arrival_time]
        return render


RENDERS = Renders()


@functools.cache
def _io_classes() -> tuple:
    # Imported on first use: vLLM may still be importing itself when the plugin loads.
    from vllm.multimodal.media.audio import AudioMediaIO
    from vllm.multimodal.media.image import ImageMediaIO
    from vllm.multimodal.media.video import VideoMediaIO

    return (ImageMediaIO, "image"), (VideoMediaIO, "video"), (AudioMediaIO, "audio")


@functools.cache
def _modality_of_type(kind: type) -> str | None:
    return next((m for cls, m in _io_classes() if issubclass(kind, cls)), None)


def modality_of(media_io) -> str | None:
    """The modality vLLM made this media IO for (None: not one of its media IOs), by its type:
    looked up once per type, for every item's load asks."""
    return _modality_of_type(type(media_io))


# --- one item: MediaConnector.load_from_url[_async] and the media IO's decode -------------------
def _begin(hook, url, media_io) -> media_loads.Item | None:
    try:
        source = media_loads.source_of(url) if isinstance(url, str) else None
        modality = modality_of(media_io) if source else None
        if modality is None:
            return None  # embeddings, or a URL vLLM refuses: not a media item
        table = hook.table
        if table.by_name[LOOKUP_ROW].status is Status.NOT_APPLIED:
            table.apply(When.MEDIA, table.version)  # this render's prompts are processed after
        item = media_loads.Item(source, modality, time.perf_counter_ns())
        if tracing.on:
            item.fetch_range = tracing.interval(item.fetch_stage)
        _loading[id(media_io)] = item
        return item
    except Exception as e:  # noqa: BLE001 - ours: the hook turns off, vLLM goes on
        hook.failed(e)
        return None


def _end(hook, item: media_loads.Item, media_io, ok: bool | None) -> None:
    """The item's load returned (ok), raised (False) or was cancelled with its request (None)."""
    try:
        _loading.pop(id(media_io), None)
        end = time.perf_counter_ns()
        if item.fetched_ns is None and item.fetch_range is not None:
            item.fetch_range.end()  # no decode came: the fetch lasted the whole load
        if ok:
            if ENABLED:
                FRONTEND.record(item.fetch_stage, (item.fetched_ns or end) - item.start_ns)
            COUNTS.loaded(item)
            render = CURRENT.get()
            if render is not None:
                render.item_loaded(item, end)
        elif ok is False:
            COUNTS.failed(item)
    except Exception as e:  # noqa: BLE001
        hook.failed(e)


def item_loaded(hook, wrapped, connector, args, kwargs, url, media_io):
    """MediaConnector.load_from_url(url, media_io): one item fetched and decoded on this thread
    (the offline LLM's chat, vLLM's synchronous parsers)."""
    item = _begin(hook, url, media_io)
    if item is None:
        return wrapped(*args, **kwargs)
    try:
        result = wrapped(*args, **kwargs)
    except Exception:
        _end(hook, item, media_io, False)
        raise
    _end(hook, item, media_io, True)
    return result


def item_loaded_async(hook, wrapped, connector, args, kwargs, url, media_io):
    """MediaConnector.load_from_url_async(url, media_io): the API server's fetch, awaited on its
    event loop (a download) or on vLLM's media threads (a data URL, a file), then the decode."""
    item = _begin(hook, url, media_io)
    loading = wrapped(*args, **kwargs)
    return loading if item is None else _awaited(hook, item, media_io, loading)


async def _awaited(hook, item, media_io, loading):
    try:
        result = await loading
    except Exception:
        _end(hook, item, media_io, False)
        raise
    except BaseException:  # cancelled: the request is gone, nothing failed
        _end(hook, item, media_io, None)
        raise
    _end(hook, item, media_io, True)
    return result


def bytes_decoded(hook, wrapped, media_io, args, kwargs, data):
    """ImageMediaIO / VideoMediaIO / AudioMediaIO.load_bytes(data): the item's bytes are in hand
    (its fetch ends), decoded into an image, video frames or audio samples."""
    return _decode(hook, wrapped, media_io, args, kwargs, len, data)


def file_decoded(hook, wrapped, media_io, args, kwargs, filepath):
    """AudioMediaIO.load_file(filepath): the audio decoder reads the file itself."""
    return _decode(hook, wrapped, media_io, args, kwargs, lambda p: os.stat(p).st_size, filepath)


def _decode(hook, wrapped, media_io, args, kwargs, size, what):
    item = _loading.get(id(media_io))
    if item is None:
        return wrapped(*args, **kwargs)  # not an item's load (a frame of a JPEG video, say)
    try:
        item.fetched_ns = start = time.perf_counter_ns()
        if item.fetch_range is not None:
            item.fetch_range.end()
        name = item.decode_stage
    except Exception as e:  # noqa: BLE001
        hook.failed(e)
        return wrapped(*args, **kwargs)
    if tracing.on:
        with tracing.span(name):
            result = wrapped(*args, **kwargs)
    else:
        result = wrapped(*args, **kwargs)
    end = time.perf_counter_ns()
    try:  # the bytes once vLLM has read them: a path that is no file is vLLM's error to raise
        item.bytes = size(what)
        if ENABLED:
            FRONTEND.record(name, end - start)
    except Exception as e:  # noqa: BLE001
        hook.failed(e)
    return result


# --- a render: its items and its multimodal processing ------------------------------------------
def chat_rendered(hook, wrapped, renderer, args, kwargs):
    """BaseRenderer.render_chat: the items of its conversations load inside it."""
    token = CURRENT.set(media_loads.Render())
    try:
        return wrapped(*args, **kwargs)
    finally:
        CURRENT.reset(token)


def chat_rendered_async(hook, wrapped, renderer, args, kwargs):
    """BaseRenderer.render_chat_async: the API server's chat request, from vLLM's arrival time
    until it is processed; its items load in tasks it starts, which see the render."""
    return _rendering(wrapped(*args, **kwargs))


async def _rendering(rendering):
    token = CURRENT.set(media_loads.Render())
    try:
        return await rendering
    finally:
        CURRENT.reset(token)


def _multimodal(prompt) -> bool:
    return isinstance(prompt, dict) and bool(prompt.get("multi_modal_data"))


def processed(hook, wrapped, renderer, args, kwargs, prompt, arrival_time):
    """BaseRenderer.process_for_engine(prompt, arrival_time): one prompt's multimodal processing
    (hashing, cache lookup, HF processor, prompt update)."""
    if not _multimodal(prompt):
        return wrapped(*args, **kwargs)
    start = time.perf_counter_ns()
    engine_input = wrapped(*args, **kwargs)
    _processed(hook, engine_input, arrival_time, start)
    return engine_input


def processed_async(hook, wrapped, renderer, args, kwargs, prompt, arrival_time):
    """BaseRenderer.process_for_engine_async: the same, awaited (vLLM runs the processor on a
    thread of its own, so the wait for it counts)."""
    processing = wrapped(*args, **kwargs)
    return _processing(hook, processing, arrival_time) if _multimodal(prompt) else processing


async def _processing(hook, processing, arrival_time):
    start = time.perf_counter_ns()
    engine_input = await processing
    _processed(hook, engine_input, arrival_time, start)
    return engine_input


def _processed(hook, engine_input, arrival_time, start: int) -> None:
    try:
        end = time.perf_counter_ns()
        hashes = engine_input.get("mm_hashes") if isinstance(engine_input, dict) else None
        found = LOOKUPS.take(hashes) if hashes is not None else None
        # Prompts rendered without a chat (vLLM's completions) share a record by arrival time.
        render = CURRENT.get() or RENDERS.by_arrival.get(arrival_time) or media_loads.Render()
        render.processor.append((start, end))
        if found and render.loaded:
            media_loads.match_cached(render, hashes, found, COUNTS)
        if hook.table.by_name[ASSIGN_ROW].status is Status.APPLIED:
            RENDERS.add(arrival_time, render)
    except Exception as e:  # noqa: BLE001
        hook.failed(e)


def cache_looked_up(hook, wrapped, processor, args, kwargs, mm_hashes):
    """BaseMultiModalProcessor._get_cache_missing_items: which of the prompt's items the
    processor cache holds (vLLM's own answer, before it adds the new ones)."""
    result = wrapped(*args, **kwargs)
    try:
        LOOKUPS.looked_up(mm_hashes, result[0])
    except Exception as e:  # noqa: BLE001
        hook.failed(e)
    return result
