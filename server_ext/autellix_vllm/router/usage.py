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
"""

from __future__ import annotations

import json
import re
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


def service_from_body(payload: bytes, meter: ServiceMeter) -> float | None:
    """The service in a non-streamed answer's ``usage``."""
    return read_answer(payload, meter)[0]


def read_answer(payload: bytes, meter: ServiceMeter) -> tuple[float | None, str | None]:
    """A non-streamed answer's service (from its ``usage``) and its ``id``, each
    None if it has none."""
    try:
        answer = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None, None
    if not isinstance(answer, dict):
        return None, None
    answer_id = answer.get("id")
    service = service_from_usage(answer.get("usage"), meter)
    return service, answer_id if isinstance(answer_id, str) else None


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
        usage = payload.get("usage")
        if payload.get("type") == "response.completed":
            response = payload.get("response")
            response = response if isinstance(response, dict) else {}
            usage = response.get("usage")
            if isinstance(response.get("id"), str):
                self.response_id = response["id"]
        service = service_from_usage(usage, self.meter)
        if service is None:
            return True
        self.service = service
        # The usage-only chunk the client did not ask for has no choices.
        return not (self.drop_usage and not payload.get("choices"))


def _event_data(event: bytes) -> Any:
    lines = [line[5:].strip() for line in event.splitlines() if line.startswith(b"data:")]
    try:
        return json.loads(b"\n".join(lines))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
