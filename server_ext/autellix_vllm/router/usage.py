"""Service a call attained, from the ``usage`` its engine reported.

Token equivalents of :class:`autellix_vllm.policy.config.ServiceMeter` (the
engines' default unit): one per generated token plus ``prefill_weight`` per
prompt token that was computed, i.e. not served from the prefix cache (cached
tokens are known only when the engine reports ``prompt_tokens_details``).

For streams, :class:`SseRelay` forwards the server-sent events and picks the
usage out of them: the last chunk of a chat or completion stream (asked for
with ``stream_options.include_usage``; dropped again when the client had not
asked for it) or the ``response.completed`` event of a response stream (with
the response's id). A
stream that ends before its usage (the client left, the engine broke) is
charged an estimate: one token per event relayed, plus its prompt. Plain
Python: the relay writes to anything with an async ``write`` (aiohttp's
response in the router, a buffer in the Ray Serve ingress).

The same final answer (or event) is also where the engine says what the call
was made of (:class:`CallReport`): its tokens, those the prefix cache served
(with ``--enable-prompt-tokens-details``), and vLLM's per-request timings (its
``metrics``, sent by engines started with ``--enable-per-request-metrics``, as
``autellix`` starts them): how long the call waited in the engine's queue, its
prefill (first scheduled to first token) and its decode (first to last token).
A program's timeline is built from them (:mod:`autellix_vllm.router.timeline`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Protocol

from autellix_vllm.policy.config import ServiceMeter

_EVENT_END = re.compile(rb"\r?\n\r?\n")


def service_from_usage(usage: Any, meter: ServiceMeter) -> float | None:
    """Chat/completions (``prompt_tokens``, ``completion_tokens``) and responses
    (``input_tokens``, ``output_tokens``) usage; None if there is none."""
    if not isinstance(usage, dict):
        return None
    generated = usage.get("completion_tokens", usage.get("output_tokens"))
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    if not isinstance(generated, int) or not isinstance(prompt, int):
        return None
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    computed = prompt - cached if isinstance(cached, int) else prompt
    return meter.amount(generated, max(0, computed))


@dataclass(frozen=True, slots=True)
class CallReport:
    """What the engine said a call was made of; None where it did not say."""

    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # of the prompt, served by the prefix cache
    completion_tokens: int | None = None
    queue_s: float | None = None  # in the engine's queue, until first scheduled
    prefill_s: float | None = None  # first scheduled to first token
    decode_s: float | None = None  # first to last token (preemptions included)


NO_REPORT = CallReport()


def call_report(answer: dict[str, Any]) -> CallReport:
    """The report in a final answer or event (a chat or completion answer, its
    last stream chunk, or a response)."""
    usage = answer.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    timings = answer.get("metrics")
    timings = timings if isinstance(timings, dict) else {}
    return CallReport(
        prompt_tokens=_count(usage.get("prompt_tokens", usage.get("input_tokens"))),
        cached_tokens=_count(details.get("cached_tokens")) if isinstance(details, dict) else None,
        completion_tokens=_count(usage.get("completion_tokens", usage.get("output_tokens"))),
        queue_s=_seconds(timings.get("queue_time_ms")),
        prefill_s=_seconds(timings.get("time_to_first_token_ms")),
        decode_s=_seconds(timings.get("generation_time_ms")),
    )


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and value >= 0 else None


def _seconds(milliseconds: Any) -> float | None:
    if isinstance(milliseconds, int | float) and milliseconds >= 0:
        return milliseconds / 1000
    return None


def service_from_body(payload: bytes, meter: ServiceMeter) -> float | None:
    """The service in a non-streamed answer's ``usage``."""
    return read_answer(payload, meter)[0]


def read_answer(payload: bytes, meter: ServiceMeter) -> tuple[float | None, str | None]:
    """A non-streamed answer's service (from its ``usage``) and its ``id``, each
    None if it has none."""
    service, answer_id, _ = read_whole_answer(payload, meter)
    return service, answer_id


def read_whole_answer(
    payload: bytes, meter: ServiceMeter
) -> tuple[float | None, str | None, CallReport]:
    """:func:`read_answer`, and the answer's :class:`CallReport`."""
    try:
        answer = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None, None, NO_REPORT
    if not isinstance(answer, dict):
        return None, None, NO_REPORT
    answer_id = answer.get("id")
    service = service_from_usage(answer.get("usage"), meter)
    return service, answer_id if isinstance(answer_id, str) else None, call_report(answer)


class EventWriter(Protocol):
    """Where :class:`SseRelay` writes the events it passes on."""

    async def write(self, data: bytes) -> None: ...


class SseRelay:
    """Copies a server-sent-event stream to the client event by event, noting usage."""

    def __init__(self, response: EventWriter, meter: ServiceMeter, drop_usage: bool):
        self.response = response
        self.meter = meter
        self.drop_usage = drop_usage
        self.service: float | None = None
        self.response_id: str | None = None  # a response stream's, from its last event
        self.report = NO_REPORT  # from the event that carries the usage
        self.events_relayed = 0
        self._pending = b""

    async def feed(self, chunk: bytes) -> None:
        """Forward every event ``chunk`` completes (one write per chunk)."""
        data = self._pending + chunk
        out = []
        start = 0
        for end in _EVENT_END.finditer(data):
            event = data[start : end.end()]
            start = end.end()
            if self._keep(event):
                out.append(event)
                self.events_relayed += 1
        self._pending = data[start:]
        if out:
            await self.response.write(b"".join(out))

    async def finish(self) -> None:
        """Forward what is left (a stream that did not end with a blank line)."""
        if self._pending:
            await self.response.write(self._pending)
            self._pending = b""

    def service_so_far(self, prompt_tokens: int) -> float:
        """The usage's service if the engine reported it, else an estimate of the
        work done: one generated token per event relayed, and ``prompt_tokens``."""
        if self.service is not None:
            return self.service
        return self.meter.amount(self.events_relayed, prompt_tokens)

    def _keep(self, event: bytes) -> bool:
        if b'"usage"' not in event:
            return True
        payload = _event_data(event)
        if not isinstance(payload, dict):
            return True
        answer = payload
        if payload.get("type") == "response.completed":
            response = payload.get("response")
            answer = response if isinstance(response, dict) else {}
            if isinstance(answer.get("id"), str):
                self.response_id = answer["id"]
        service = service_from_usage(answer.get("usage"), self.meter)
        if service is None:
            return True
        self.service = service
        self.report = call_report(answer)
        # The usage-only chunk the client did not ask for has no choices.
        return not (self.drop_usage and not payload.get("choices"))


def _event_data(event: bytes) -> Any:
    lines = [line[5:].strip() for line in event.splitlines() if line.startswith(b"data:")]
    try:
        return json.loads(b"\n".join(lines))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
