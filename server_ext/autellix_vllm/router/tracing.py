"""OpenTelemetry traces of programs: a trace per program, a span per call.

Off unless the ``otel`` extra is installed and the standard variables ask for
it (:func:`tracing_asked`): ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` set, ``OTEL_SDK_DISABLED`` not true,
``OTEL_TRACES_EXPORTER`` unset or naming ``otlp``. Then the router exports
over OTLP/HTTP (protobuf), in batches from a thread of the SDK's own, under
``OTEL_SERVICE_NAME`` (default ``autellix-router``); every other ``OTEL_*``
variable (headers, timeouts, sampler, batch sizes) means what the
OpenTelemetry specification says. Off, the router's only cost per call is
checking that it has no tracer.

The spans (:class:`ProgramTracer`):

* ``autellix.program``: one per program, from its first call's arrival until
  it leaves the router's table (ended, or dropped idle), when it is exported
  with the program's totals. Its parent is the first call's ``traceparent``,
  if the client sent one; else it starts a trace of its own: the program's.
* ``autellix.call``: one per call the table admitted, from its arrival at the
  router to the end of its answer. Its parent is the client's W3C
  ``traceparent`` if the call carries one (an agent framework's span: the two
  traces are one), else the program's span, so that all calls of a program
  share its trace id. A call under the client's parent links to its program's
  span. The call's own ``traceparent`` goes to the engine in place of the
  client's, and back to the client on the answer.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autellix_vllm.protocol.paths import CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH, RESPONSES_PATH

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span

    from autellix_vllm.router.admission import Admitted
    from autellix_vllm.router.calls import Call
    from autellix_vllm.router.dispatch import Outcome
    from autellix_vllm.router.keys import Client
    from autellix_vllm.router.programs import ProgramRecord

log = logging.getLogger("autellix.router")

DEFAULT_SERVICE_NAME = "autellix-router"
PROGRAM_SPAN = "autellix.program"
CALL_SPAN = "autellix.call"
# W3C trace context: the client's are replaced by the call's own on the way to the engine.
TRACE_CONTEXT_HEADERS = frozenset({"traceparent", "tracestate"})
# The only protocol the router exports in (the otel extra's exporter).
OTLP_PROTOCOL = "http/protobuf"
# gen_ai.operation.name of each generation path (OpenTelemetry's GenAI conventions).
_OPERATIONS = {
    CHAT_COMPLETIONS_PATH: "chat",
    COMPLETIONS_PATH: "text_completion",
    RESPONSES_PATH: "chat",
}


def tracing_asked(environ: Mapping[str, str]) -> bool:
    """Whether the standard ``OTEL_*`` variables in ``environ`` ask for exported traces."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {e.strip().lower() for e in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")}
    if "otlp" not in exporters:
        if exporters - {"none", ""}:
            log.warning("OTEL_TRACES_EXPORTER=%s: the router exports traces over OTLP only",
                        environ["OTEL_TRACES_EXPORTER"])  # fmt: skip
        return False
    endpoints = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
    if not any(environ.get(name) for name in endpoints):
        return False
    protocol = environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    )
    if protocol and protocol != OTLP_PROTOCOL:
        log.warning("OTLP protocol %r: the router exports over %s only; no traces",
                    protocol, OTLP_PROTOCOL)  # fmt: skip
        return False
    return True


def tracer_from_environment() -> ProgramTracer | None:
    """The router's tracer, exporting over OTLP/HTTP, if the ``OTEL_*`` variables ask
    for traces and the ``otel`` extra is installed; else None (tracing off)."""
    if not tracing_asked(os.environ):
        return None
    try:
        # Imported here: the SDK takes a quarter of a second to import, and most
        # routers never trace.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as error:
        log.warning("OTEL_* variables ask for traces, but the otel extra is not installed"
                    " (pip install 'autellix[otel]'): %s", error)  # fmt: skip
        return None
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        # Neither OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES named the service.
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource)  # the sampler: OTEL_TRACES_SAMPLER
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    log.info("exporting traces over OTLP/HTTP as %s", resource.attributes.get(SERVICE_NAME))
    return ProgramTracer(provider)


@dataclass(slots=True)
class CallTrace:
    """One call's span, and its trace context as headers (``traceparent``, and
    ``tracestate`` if any): what the engine and the client are told."""

    tracer: ProgramTracer
    span: Span
    headers: dict[str, str]

    def finished(self, call: Call, outcome: Outcome) -> None:
        """The call ended as ``outcome`` says: end its span."""
        self.tracer.call_finished(self.span, call, outcome)


class ProgramTracer:
    """Starts and ends the programs' and calls' spans (see the module)."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        # The OpenTelemetry API, imported only by a router that traces (as the SDK is).
        self._trace = trace
        self.provider = provider
        self.tracer = provider.get_tracer("autellix.router")
        self.propagator = TraceContextTextMapPropagator()  # W3C trace context
        # Program id -> its span and record, while the program is in the router's table.
        self._programs: dict[str, tuple[Span, ProgramRecord]] = {}

    def call_started(
        self, client_headers: Mapping[str, str], call: Call, admitted: Admitted, caller: Client,
        elapsed_s: float,
    ) -> CallTrace:  # fmt: skip
        """Start ``call``'s span; it arrived ``elapsed_s`` ago."""
        trace = self._trace
        start_ns = time.time_ns() - int(elapsed_s * 1e9)
        client_context = self.propagator.extract(client_headers)
        client_sent = trace.get_current_span(client_context).get_span_context().is_valid
        record = admitted.record
        identity = admitted.identity
        attributes: dict[str, Any] = {
            "autellix.call.id": identity.call_id,
            "autellix.thread.id": identity.thread_id,
            "autellix.thread.parent_id": identity.parent_thread_id,
            "autellix.owner": caller.name if record is None else record.owner_name,
            "gen_ai.operation.name": _OPERATIONS.get(call.path, "chat"),
            "gen_ai.request.model": call.model,
        }
        links = []
        if record is None:
            context = client_context if client_sent else None
        else:
            program_span = self._program_span(record, client_context, start_ns)
            attributes["autellix.program.id"] = record.program_id
            # Its service over all engines when the call arrived: what ranks it.
            attributes["autellix.program.service"] = record.service
            if client_sent:
                context = client_context
                links.append(trace.Link(program_span.get_span_context()))
            else:
                context = trace.set_span_in_context(program_span)
        span = self.tracer.start_span(
            CALL_SPAN, context, trace.SpanKind.SERVER, _present(attributes), links, start_ns
        )
        headers: dict[str, str] = {}
        self.propagator.inject(headers, trace.set_span_in_context(span))
        return CallTrace(self, span, headers)

    def call_finished(self, span: Span, call: Call, outcome: Outcome) -> None:
        """End a call's span with what became of it: the engine that answered,
        the service charged, the engine's report, the HTTP status the client got."""
        report = outcome.report
        status = outcome.response.status if outcome.response is not None else None
        completed = outcome.completed
        span.set_attributes(
            _present(
                {
                    "autellix.engine": outcome.engine.name if outcome.engine else None,
                    "autellix.call.completed": completed,
                    "autellix.call.service": outcome.charged(call.prompt_tokens),
                    # In the engine's queue until first scheduled (vLLM's queue time).
                    "autellix.call.wait_s": report.queue_s,
                    "autellix.call.prefill_s": report.prefill_s,
                    "autellix.call.decode_s": report.decode_s,
                    "gen_ai.usage.input_tokens": report.prompt_tokens,
                    "gen_ai.usage.output_tokens": report.completion_tokens,
                    "gen_ai.usage.cache_read.input_tokens": report.cached_tokens,
                    "http.response.status_code": status,
                }
            )
        )
        # As HTTP server spans do: a client's error (4xx) is not the call's failure.
        if not completed and not (status is not None and 400 <= status < 500):
            reason = "no answer" if status is None else f"the answer ended early ({status})"
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, reason))
        span.end()

    def program_left(self, program_id: str) -> None:
        """The program left the router's table: end its span with its totals."""
        entry = self._programs.pop(program_id, None)
        if entry is None:
            return
        span, record = entry
        span.set_attributes(
            {
                "autellix.program.service": record.service,
                "autellix.program.calls_completed": record.calls_completed,
                "autellix.program.calls_failed": record.calls_failed,
                "autellix.program.threads": len(record.threads),
                "autellix.program.engines": sorted(record.calls_per_engine),
                "autellix.program.rebinds": record.rebinds,
            }
        )
        span.end()

    def shutdown(self) -> None:
        """End the spans of the programs still open and export what is left
        (blocking: run it off the event loop)."""
        for program_id in list(self._programs):
            self.program_left(program_id)
        self.provider.shutdown()

    def _program_span(self, record: ProgramRecord, client_context: Any, start_ns: int) -> Span:
        entry = self._programs.get(record.program_id)
        if entry is not None:
            return entry[0]
        attributes = {
            "autellix.program.id": record.program_id,
            "autellix.program.name": record.name,
            "autellix.owner": record.owner_name,
        }
        span = self.tracer.start_span(
            PROGRAM_SPAN, client_context, self._trace.SpanKind.INTERNAL, _present(attributes),
            start_time=start_ns,
        )  # fmt: skip
        self._programs[record.program_id] = (span, record)
        return span


def _present(attributes: dict[str, Any]) -> dict[str, Any]:
    """The attributes that have a value (OpenTelemetry refuses None)."""
    return {key: value for key, value in attributes.items() if value is not None}
