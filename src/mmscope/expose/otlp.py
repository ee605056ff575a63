"""vLLM's OTLP request span with the multimodal facts (docs/design.md §5a): the attribute names, in
vLLM's span-attribute style; the child spans of the TTFT parts, laid on the request's timeline;
and the span processor that sets the attributes on vLLM's own `llm_request` span as it starts.

Independent of vLLM; uses the OpenTelemetry SDK that vLLM's tracing runs on."""
from __future__ import annotations

import contextlib
import contextvars

from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor

from mmscope import stages
from mmscope.carry import ttft_split

REQUEST_SPAN = "llm_request"  # vLLM's span name (OutputProcessor.do_tracing)
MULTIMODAL = "gen_ai.multimodal."  # + a record's count (carry/request_facts.py)
TTFT_PART = "gen_ai.latency.ttft_part."  # + a TTFT part (stages.TTFT_PARTS), seconds
CHILD = "ttft."  # + a TTFT part: the child spans' names
# The order of the parts in time: the API server awaits the items' media inside the render (the
# chat template follows them), then runs the processor; EngineCore queues the request, then its
# first step loads from the EC connector, runs the encoder and the forward (V1's and V2's order).
TIMELINE = (*stages.TTFT_API_PARTS, stages.TTFT_OTHER, stages.TTFT_QUEUE,
            stages.TTFT_EC_LOAD, stages.TTFT_ENCODER, stages.TTFT_PREFILL)


def attributes(record: dict[str, int] | None, split: ttft_split.TtftSplit | None) -> dict:
    """The attributes mmscope adds to a multimodal request's span."""
    found = {}
    if record:
        found.update((MULTIMODAL + k, v) for k, v in record.items() if k not in ttft_split.SHARES)
    if split:
        found.update((TTFT_PART + p, v) for p, v in split.parts.items())
    return found


def layout(split: ttft_split.TtftSplit, arrival_s: float, queued_wall_s: float) -> list[tuple]:
    """(name, start ns, end ns) of the child spans: contiguous from vLLM's arrival time (the
    span's start) to its first token, each part as long as the split says, so that they add up
    to the TTFT. The split's `other` is two stretches: the way to EngineCore's queue (until
    `queued_wall_s`, EngineCore's queued time on this wall clock) and the first token's way
    back. Parts of no length get no span."""
    start = int(arrival_s * 1e9)  # as vLLM starts its span
    end = start + round(split.ttft_s * 1e9)
    length = {p: max(0, round(v * 1e9)) for p, v in split.parts.items()}
    after_api = start + sum(length[p] for p in stages.TTFT_API_PARTS)
    length[stages.TTFT_OTHER] = min(max(0, round(queued_wall_s * 1e9) - after_api),
                                    length[stages.TTFT_OTHER])
    spans, t = [], start
    for part in TIMELINE:
        if length[part]:
            spans.append((CHILD + part, t, t + length[part]))
            t += length[part]
    if end > t:
        spans.append((CHILD + stages.TTFT_OTHER, t, end))
    return spans


class _Made:
    context = None  # the SpanContext of the llm_request span made while enriching


_PENDING: contextvars.ContextVar[tuple[dict, _Made] | None] = contextvars.ContextVar(
    "mmscope_request_span", default=None)


class RequestSpanAttributes(SpanProcessor):
    """Sets the attributes of the request being traced (enriching()) on vLLM's `llm_request`
    span as it starts: OpenTelemetry's own hook into a span's life; vLLM's attributes follow."""

    def on_start(self, span, parent_context=None) -> None:
        pending = _PENDING.get()
        if pending is not None and span.name == REQUEST_SPAN:
            span.set_attributes(pending[0])
            pending[1].context = span.get_span_context()


@contextlib.contextmanager
def enriching(attrs: dict):
    """While vLLM makes a request's span: yields what records the span's context."""
    made = _Made()
    token = _PENDING.set((attrs, made))
    try:
        yield made
    finally:
        _PENDING.reset(token)


_tracer = None


def install() -> None:
    """The span processor on vLLM's tracer provider (set when vLLM started its tracer)."""
    global _tracer
    provider = trace.get_tracer_provider()
    provider.add_span_processor(RequestSpanAttributes())
    _tracer = provider.get_tracer("mmscope")


def child_spans(parent, spans: list[tuple]) -> None:
    """The spans of `layout`, children of the span whose SpanContext is `parent`."""
    context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
    for name, start, end in spans:
        _tracer.start_span(name, context=context, start_time=start).end(end_time=end)
