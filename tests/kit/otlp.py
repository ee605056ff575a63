"""An OTLP/gRPC trace receiver on loopback, built on opentelemetry-proto's service definitions (no
OpenTelemetry Collector installs from PyPI, Debian or npm): it decodes what an exporter really
sends, such as vLLM's `--otlp-traces-endpoint`, into plain spans."""
from __future__ import annotations

import threading
import time
from concurrent import futures
from typing import NamedTuple

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class Span(NamedTuple):
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root span
    start_ns: int
    end_ns: int
    attributes: dict
    resource: dict
    kind: int

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


def _value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def _attributes(key_values) -> dict:
    return {kv.key: _value(kv.value) for kv in key_values}


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """`with Receiver() as r:` serves on r.endpoint; r.spans() are the spans received so far."""

    def __init__(self):
        self._spans: list[Span] = []
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def Export(self, request, context):  # noqa: N802 - the service's method name
        got = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    got.append(Span(s.name, s.trace_id.hex(), s.span_id.hex(),
                                    s.parent_span_id.hex(), s.start_time_unix_nano,
                                    s.end_time_unix_nano, _attributes(s.attributes), resource,
                                    s.kind))
        with self._lock:
            self._spans.extend(got)
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[Span]:
        with self._lock:
            return list(self._spans)

    def wait_for(self, predicate, timeout_s: float = 30) -> list[Span]:
        """The spans received once predicate(spans) holds, or at the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans()
            if predicate(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.1)

    def __enter__(self) -> "Receiver":
        self._server.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.stop(grace=None)


def children(spans: list[Span], parent: Span) -> list[Span]:
    return sorted((s for s in spans if s.parent_id == parent.span_id and
                   s.trace_id == parent.trace_id), key=lambda s: s.start_ns)


# What a server needs to export its spans here within a moment (the SDK batches for 5 s otherwise).
def server_args(receiver: Receiver) -> list[str]:
    return ["--otlp-traces-endpoint", receiver.endpoint]


SERVER_ENV = {"OTEL_BSP_SCHEDULE_DELAY": "100"}


# --- vLLM's request spans ------------------------------------------------------------------------
REQUEST = "llm_request"
TTFT = "gen_ai.latency.time_to_first_token"
MULTIMODAL = "gen_ai.multimodal."
TTFT_PART = "gen_ai.latency.ttft_part."


def request_spans(spans: list[Span]) -> dict[str, Span]:
    """vLLM's llm_request spans by request id (the response's id)."""
    return {s.attributes["gen_ai.request.id"]: s for s in spans if s.name == REQUEST}


def multimodal(span: Span) -> dict:
    """The multimodal facts mmscope set on the span, without their common prefix."""
    return {k[len(MULTIMODAL):]: v for k, v in span.attributes.items() if k.startswith(MULTIMODAL)}


def parts(spans: list[Span], span: Span) -> dict[str, float]:
    """The span's child spans, checked: contiguous from vLLM's arrival time (the span's start),
    adding up to its time to first token within a millisecond, each part as long as its
    attribute says (within a microsecond); returned as seconds per part."""
    kids = children(spans, span)
    assert kids, f"no child spans under {span.attributes['gen_ai.request.id']}"
    assert kids[0].start_ns == span.start_ns
    for before, after in zip(kids, kids[1:]):
        assert before.end_ns == after.start_ns, (before, after)
    total = sum(k.duration_ns for k in kids) / 1e9
    assert abs(total - span.attributes[TTFT]) < 1e-3, (total, span.attributes[TTFT])
    by_part: dict[str, float] = {}
    for k in kids:
        assert k.name.startswith("ttft."), k.name
        part = k.name[len("ttft."):]
        by_part[part] = by_part.get(part, 0.0) + k.duration_ns / 1e9
    for part, seconds in by_part.items():
        assert abs(seconds - span.attributes[TTFT_PART + part]) < 1e-6, (part, span.attributes)
    return by_part
