"""API server: vLLM's OTLP `llm_request` span of each multimodal request carries its items, their
encoder-cache outcomes and, with the TTFT split on, its TTFT parts and a child span per part
(docs/design.md §5a). Nothing here runs per request unless vLLM traces requests."""
from __future__ import annotations

import atexit
import functools
import threading
import time

from mmscope.carry import ttft
from mmscope.carry.span_join import HELD, HOLD_S, SpanJoin
from mmscope.vllm.patching import failed

SPANS: SpanJoin | None = None  # set once vLLM's output processor traces requests


def output_processor_created(wrapped, instance, args, kwargs):
    """OutputProcessor.__init__ with tracing_enabled (--otlp-traces-endpoint), after vLLM set up
    its tracer provider: only then are the per-request hooks applied, once per process."""
    result = wrapped(*args, **kwargs)
    if kwargs.get("tracing_enabled"):
        try:
            _start()
        except Exception as e:  # noqa: BLE001 - ours: the hook turns off, vLLM goes on
            failed("otlp.tracing_enabled", e)
    return result


def _start() -> None:
    global SPANS
    from mmscope.expose import otlp
    from mmscope.vllm.instrumentor import get_instrumentor

    if SPANS is None:
        otlp.install()
        SPANS = SpanJoin(ttft.enabled())
        threading.Thread(target=_sweep, name="mmscope-request-spans", daemon=True).start()
        # atexit runs the last registered first: held spans go before vLLM's provider shuts down.
        atexit.register(SPANS.release_all)
    get_instrumentor().trace_requests()


def _sweep() -> None:
    """Held spans past HOLD_S go with what has arrived, even when the server has gone idle."""
    while True:
        time.sleep(HOLD_S / 5)
        try:
            SPANS.expired(time.monotonic())
        except Exception as e:  # noqa: BLE001
            failed("otlp.request_span", e)


def request_added(wrapped, output_processor, args, kwargs):
    """OutputProcessor.add_request: a request with multimodal items; its span will wait for its
    record."""
    try:
        request = args[0] if args else kwargs["request"]
        if request.mm_features:
            SPANS.expect(request.request_id)
    except Exception as e:  # noqa: BLE001
        failed("otlp.request_added", e)
    return wrapped(*args, **kwargs)


def request_traced(wrapped, output_processor, args, kwargs):
    """OutputProcessor.do_tracing, once per finished request: a multimodal request's span is
    made with its facts now, or held until they arrive (vLLM's call itself, made later)."""
    try:
        req_state = args[1] if len(args) > 1 else kwargs["req_state"]
        whole = SPANS.traced(req_state.request_id,
                             functools.partial(_emit_held, wrapped, args, kwargs),
                             time.monotonic())
    except Exception as e:  # noqa: BLE001
        failed("otlp.request_span", e)
        whole = None
    if whole is None:
        return wrapped(*args, **kwargs)
    if whole is HELD:
        return None
    return _emit(wrapped, args, kwargs, *whole)


def arrived(records: dict[str, dict[str, int]], splits: list[ttft.TtftSplit]) -> None:
    """Records and splits that reached the API server (request_times): held spans now whole go."""
    try:
        SPANS.arrived(records, splits)
    except Exception as e:  # noqa: BLE001
        failed("otlp.request_span", e)


def _emit(wrapped, args, kwargs, record, split):
    """vLLM's own do_tracing, its span given the request's attributes as it starts; then the
    child spans of the TTFT parts."""
    from mmscope.expose import otlp

    try:
        attrs = otlp.attributes(record, split)
    except Exception as e:  # noqa: BLE001
        failed("otlp.request_span", e)
        attrs = None
    if not attrs:
        return wrapped(*args, **kwargs)
    with otlp.enriching(attrs) as made:
        result = wrapped(*args, **kwargs)
    if split is not None and made.context is not None:
        try:
            stats = (args[1] if len(args) > 1 else kwargs["req_state"]).stats
            # EngineCore's timestamps are the host's monotonic clock, as vLLM takes them.
            queued_wall_s = stats.queued_ts + (time.time() - time.monotonic())
            otlp.child_spans(made.context, otlp.layout(split, stats.arrival_time, queued_wall_s))
        except Exception as e:  # noqa: BLE001
            failed("otlp.request_span", e)
    return result


def _emit_held(wrapped, args, kwargs, record, split) -> None:
    """A held span, made from the stats path or the sweeping thread, where no vLLM caller waits
    for do_tracing's outcome: an error in it turns the hook off, as one of mmscope's own."""
    try:
        _emit(wrapped, args, kwargs, record, split)
    except Exception as e:  # noqa: BLE001
        failed("otlp.request_span", e)
