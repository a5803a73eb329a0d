"""A real OTLP/HTTP trace receiver for tests: ``POST /v1/traces`` with protobuf
bodies, decoded with ``opentelemetry-proto`` (what the router's exporter sends)."""

from __future__ import annotations

import contextlib
import gzip
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from local_http import serving
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str  # "" for a root span
    attributes: dict[str, Any]
    links: list[tuple[str, str]]  # (trace id, span id) of each link
    resource: dict[str, Any]


@dataclass
class OtlpReceiver:
    url: str = ""
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0

    def named(self, name: str) -> list[ReceivedSpan]:
        return [span for span in self.spans if span.name == name]


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


@contextlib.asynccontextmanager
async def otlp_receiver() -> AsyncIterator[OtlpReceiver]:
    """An OTLP/HTTP receiver on 127.0.0.1 and a free port; its ``url`` is the
    base an exporter's ``OTEL_EXPORTER_OTLP_ENDPOINT`` names."""
    received = OtlpReceiver()

    async def traces(request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        export = ExportTraceServiceRequest.FromString(body)
        received.requests += 1
        for resource_spans in export.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.spans.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            attributes=_attributes(span.attributes),
                            links=[(ln.trace_id.hex(), ln.span_id.hex()) for ln in span.links],
                            resource=resource,
                        )
                    )
        answer = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=answer, content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    async with serving(web.AppRunner(app, access_log=None)) as url:
        received.url = url
        yield received
