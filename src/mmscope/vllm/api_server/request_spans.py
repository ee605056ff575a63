"""API server: vLLM's OTLP `llm_request` span of each multimodal request carries its items, their
encoder-cache outcomes and, with the TTFT split on, its TTFT parts and a child span per part
(docs/design.md §5a). Nothing here runs per request unless vLLM traces requests."""
from __future__ import annotations

import atexit
import functools
import threading
import time

from mmscope.carry import ttft_split
from mmscope.carry.span_join import HELD, HOLD_S, SpanJoin
from mmscope.vllm.patching import When

SPANS: SpanJoin | None = None  # set once vLLM's output processor traces requests
SPAN_HOOK = "otlp.request_span"  # the row whose work the spans are, wherever they are made
_span_hook = None


def output_processor_created(hook, wrapped, instance, args, kwargs, tracing_enabled):
    """OutputProcessor.__init__ with tracing_enabled (--otlp-traces-endpoint), after vLLM set up
    its tracer provider: only then are the per-request hooks applied, once per process."""
    result = wrapped(*args, **kwargs)
    if tracing_enabled:
        try:
            _start(hook.table)
        except Exception as e:  # noqa: BLE001 - ours: the hook turns off, vLLM goes on
            hook.failed(e)
    return result


def _start(table) -> None:
    global SPANS, _span_hook
    from mmscope.expose import otlp

    if SPANS is None:
        otlp.install()
        SPANS = SpanJoin(ttft_split.enabled())
        _span_hook = table.by_name[SPAN_HOOK]
        threading.Thread(target=_sweep, name="mmscope-request-spans", daemon=True).start()
        # atexit runs the last registered first: held spans go before vLLM's provider shuts down.
        atexit.register(SPANS.release_all)
    table.apply(When.OTLP, table.version)


def _sweep() -> None:
    """Held spans past HOLD_S go with what has arrived, even when the server has gone idle."""
    while True:
        time.sleep(HOLD_S / 5)
        try:
            SPANS.expired(time.monotonic())
        except Exception as e:  # noqa: BLE001
            _span_hook.failed(e)


def request_added(hook, wrapped, output_processor, args, kwargs, request):
    """OutputProcessor.add_request: a request with multimodal items; its span will wait for its
    record."""
    try:
        if request.mm_features:
            SPANS.expect(request.request_id)
    except Exception as e:  # noqa: BLE001
        hook.failed(e)
    return wrapped(*args, **kwargs)


def request_traced(hook, wrapped, output_processor, args, kwargs, req_state):
    """OutputProcessor.do_tracing, once per finished request: a multimodal request's span is
    made with its facts now, or held until they arrive (vLLM's call itself, made later)."""
    try:
        whole = SPANS.traced(req_state.request_id,
                             functools.partial(_emit_held, wrapped, args, kwargs, req_state),
                             time.monotonic())
    except Exception as e:  # noqa: BLE001
        hook.failed(e)
        whole = None
    if whole is None:
        return wrapped(*args, **kwargs)
    if whole is HELD:
        return None
    return _emit(wrapped, args, kwargs, req_state, *whole)


def arrived(records: dict[str, dict[str, int]], splits: list[ttft_split.TtftSplit]) -> None:
    """Records and splits that reached the API server (request_times): held spans now whole go."""
    try:
        SPANS.arrived(records, splits)
    except Exception as e:  # noqa: BLE001
        _span_hook.failed(e)


def _emit(wrapped, args, kwargs, req_state, record, split):
    """vLLM's own do_tracing, its span given the request's attributes as it starts; then the
    child spans of the TTFT parts."""
    from mmscope.expose import otlp

    try:
        attrs = otlp.attributes(record, split)
    except Exception as e:  # noqa: BLE001
        _span_hook.failed(e)
        attrs = None
    if not attrs:
        return wrapped(*args, **kwargs)
    with otlp.enriching(attrs) as made:
        result = wrapped(*args, **kwargs)
    if split is not None and made.context is not None:
        try:
            stats = req_state.stats
            # EngineCore's timestamps are the host's monotonic clock, as vLLM takes them.
            queued_wall_s = stats.queued_ts + (time.time() - time.monotonic())
            otlp.child_spans(made.context, otlp.layout(split, stats.arrival_time, queued_wall_s))
        except Exception as e:  # noqa: BLE001
            _span_hook.failed(e)
    return result


def _emit_held(wrapped, args, kwargs, req_state, record, split) -> None:
    """A held span, made from the stats path or the sweeping thread, where no vLLM caller waits
    for do_tracing's outcome: an error in it turns the hook off, as one of mmscope's own."""
    try:
        _emit(wrapped, args, kwargs, req_state, record, split)
    except Exception as e:  # noqa: BLE001
        _span_hook.failed(e)
