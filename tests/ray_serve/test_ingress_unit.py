"""The ingress (``ray_serve.ingress``) with stand-ins for Serve's handles: a real
directory, engine replicas that answer, fail or die as each test says."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("ray")

from autellix_vllm.policy.flow_control import FlowControlConfig  # noqa: E402
from autellix_vllm.policy.routing import Route  # noqa: E402
from autellix_vllm.protocol.identity import CallIdentity  # noqa: E402
from autellix_vllm.ray_serve.directory import ProgramDirectory  # noqa: E402
from autellix_vllm.ray_serve.ingress import Ingress, IngressSettings  # noqa: E402
from autellix_vllm.ray_serve.messages import AnswerHead, EngineCall  # noqa: E402
from autellix_vllm.router.keys import ANONYMOUS  # noqa: E402
from ray.exceptions import ActorDiedError  # noqa: E402
from starlette.requests import Request  # noqa: E402

MODEL = "tiny"
ANSWER = {"choices": [{"message": {"content": "hi"}}],
          "usage": {"prompt_tokens": 10, "completion_tokens": 2}}  # fmt: skip


class Remote:
    """``handle.method`` as a stand-in: ``remote(...)`` runs ``function``."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.remote = function


class Engines:
    """The engines' handle: each call is answered by the next of ``replies`` (a
    replica name, or an exception its stream raises before the head)."""

    def __init__(self, *replies: str | BaseException) -> None:
        self.replies = list(replies)
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.identities: list[CallIdentity] = []  # what each call's engine was to be told
        self.generate = Remote(self._generate)
        self.answer = Remote(self._answer)
        self.models = Remote(self._models)

    def options(self, **options: Any) -> Engines:
        return self

    async def _models(self) -> list[dict[str, Any]]:
        return [{"id": MODEL}]

    async def _answer(self, call: EngineCall) -> AnswerHead:
        return await self._generate(call).__anext__()

    def _generate(self, call: EngineCall) -> Stream:
        reply = self.replies.pop(0)
        placed_on = reply if isinstance(reply, str) else "dying"
        call.route, call.placed_on = Route(0, "bind", binds=True), placed_on
        self.calls.append((placed_on, call.avoid))
        self.identities.append(call.identity)
        return Stream(reply, call)


class Stream:
    def __init__(self, reply: str | BaseException, call: EngineCall) -> None:
        self.reply, self.call = reply, call

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> AnswerHead:
        if isinstance(self.reply, BaseException):
            raise self.reply
        body = json.dumps(ANSWER).encode()
        head = {"Content-Type": "application/json"}
        return AnswerHead(200, head, self.reply, self.call.route, body)

    def cancel(self) -> None:
        pass


class Directory:
    """The directory's handle over a real :class:`ProgramDirectory` (``options``:
    its keyword arguments)."""

    def __init__(self, **options: Any) -> None:
        self.directory = ProgramDirectory(**options)
        for name in ("issue", "admit", "apply", "end", "page"):
            setattr(self, name, Remote(self._async(getattr(self.directory, name))))
        for name in ("enter", "leave"):  # async already: the gate's, on the event loop
            setattr(self, name, Remote(getattr(self.directory, name)))

    @staticmethod
    def _async(method: Callable[..., Any]) -> Callable[..., Any]:
        async def call(*args: Any) -> Any:
            return method(*args)

        return call


def request(method: str, path: str, body: Any = None, headers: dict[str, str] | None = None):
    raw = b"" if body is None else json.dumps(body).encode()
    pairs = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {"type": "http", "method": method, "path": path, "query_string": b"", "headers": pairs}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": raw, "more_body": False}

    return Request(scope, receive)


def serve_calls(engines: Engines, *requests: Any, **settings: Any) -> tuple[list, Directory]:
    directory = Directory()
    ingress = Ingress(engines, directory, IngressSettings(**settings))  # type: ignore[arg-type]

    async def run() -> list:
        answers = [await ingress(r) for r in requests]
        directory.directory.apply(ingress.reports.take())  # what the flusher would send
        if ingress._flusher is not None:
            ingress._flusher.cancel()
        return answers

    return asyncio.run(run()), directory


def chat(program_id: str | None = None, call_id: str = "c1"):
    headers = {"X-Autellix-Program-Id": program_id, "X-Autellix-Call-Id": call_id}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    return request("POST", "/v1/chat/completions", body, headers if program_id else None)


def error(answer) -> dict[str, Any]:
    return json.loads(answer.body)["error"]


def test_a_call_whose_replica_dies_is_answered_by_another_and_counted_once():
    engines = Engines(ActorDiedError(), "b")
    (answer,), directory = serve_calls(engines, chat("prog-1"))
    assert answer.status_code == 200 and json.loads(answer.body) == ANSWER
    assert engines.calls == [("dying", ()), ("b", ("dying",))]
    (program,) = directory.directory.page(ANONYMOUS, None, 9)["programs"]
    assert (program["calls_completed"], program["calls_failed"]) == (1, 0)
    assert program["engine"] == "b" and program["service"] > 0


def test_when_every_try_fails_the_call_is_a_502_and_a_failed_call():
    engines = Engines(ActorDiedError(), ActorDiedError())
    (answer,), directory = serve_calls(engines, chat("prog-1"), max_attempts=2)
    assert answer.status_code == 502 and error(answer)["code"] == "engine_unreachable"
    (program,) = directory.directory.page(ANONYMOUS, None, 9)["programs"]
    assert (program["calls_completed"], program["calls_failed"], program["calls_active"]) == (
        0, 1, 0)  # fmt: skip


def test_the_directorys_refusals_and_keys_are_the_routers_errors():
    engines = Engines("a")
    key = "sk-ingress-test-key-123456"
    answers, _ = serve_calls(
        engines,
        chat("prog-1"),
        request("POST", "/autellix/v1/programs", headers={"Authorization": f"Bearer {key}"}),
        api_key=key,
    )
    assert answers[0].status_code == 401 and error(answers[0])["code"] == "invalid_api_key"
    assert answers[0].headers["WWW-Authenticate"] == "Bearer"
    assert answers[1].status_code == 200 and engines.calls == []


def test_a_reused_call_id_is_refused_before_any_replica_sees_it():
    engines = Engines("a")
    answers, _ = serve_calls(engines, chat("prog-1", "c1"), chat("prog-1", "c1"))
    assert answers[0].status_code == 200
    assert answers[1].status_code == 409 and error(answers[1])["code"] == "call_id_reused"
    assert len(engines.calls) == 1


def test_bad_requests_get_the_routers_codes():
    answers, _ = serve_calls(
        Engines(),
        request("POST", "/v1/chat/completions", {"model": MODEL, "pad": "x" * 200}),
        request("GET", "/v1/chat/completions"),
        request("GET", "/nowhere"),
        max_body_bytes=100,
    )
    assert [(a.status_code, error(a)["code"]) for a in answers] == [
        (413, "body_too_large"), (405, "method_not_allowed"), (404, "not_found")]  # fmt: skip


# One seat, no reserve, no linger: a batch call waits exactly while the seat is taken.
ONE_SEAT = {"flow_control": FlowControlConfig(seat_share=1.0, reserve_share=0.0, linger_s=0.0),
            "seats": 1}  # fmt: skip


def batch_chat(program_id: str, call_id: str):
    answer = chat(program_id, call_id)
    answer.scope["headers"].append((b"x-autellix-priority", b"batch"))
    return answer


async def left_the_gate(directory: Directory, in_flight: int) -> dict[str, Any]:
    """The gate once the ingress's leaves reached it (its background sender)."""
    for _ in range(100):
        flow = await directory.directory.flow()
        if flow == {"held": {}, "in_flight": in_flight}:
            return flow
        await asyncio.sleep(0.01)
    raise AssertionError(f"calls still at the gate: {flow}")


@pytest.mark.timeout(30)  # a seat never given back holds the next call
async def test_a_gated_call_goes_with_its_band_and_leaves_the_gate_however_it_ends():
    engines = Engines("a", ActorDiedError(), ActorDiedError())
    directory = Directory(**ONE_SEAT)
    ingress = Ingress(engines, directory, IngressSettings(max_attempts=2))  # type: ignore[arg-type]
    answered = await ingress(batch_chat("prog-1", "c1"))
    failed = await ingress(batch_chat("prog-1", "c2"))
    assert (answered.status_code, failed.status_code) == (200, 502)
    # The one seat was given back each time: the second call was not held.
    await left_the_gate(directory, in_flight=0)
    assert [identity.priority for identity in engines.identities] == [1, 1, 1]


@pytest.mark.timeout(30)  # a seat never given back holds the next call
async def test_a_held_call_whose_client_leaves_never_reaches_a_replica():
    engines = Engines("a")
    directory = Directory(**ONE_SEAT)
    ingress = Ingress(engines, directory, IngressSettings())  # type: ignore[arg-type]
    assert await directory.directory.enter("taken", 1, "other") is not None  # the one seat
    waiting = asyncio.create_task(ingress(batch_chat("prog-1", "c1")))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if (await directory.directory.flow())["held"] == {"batch": 1}:
            break
    waiting.cancel()  # Serve cancels the handler of a client that left
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await left_the_gate(directory, in_flight=1)  # only the seat taken above
    assert engines.calls == []
    directory.directory.apply(ingress.reports.take())
    (program,) = directory.directory.page(ANONYMOUS, None, 9)["programs"]
    assert (program["calls_failed"], program["calls_active"]) == (1, 0)


@pytest.mark.timeout(30)  # a seat never given back holds the next call
async def test_a_held_call_goes_to_its_replica_with_its_wait_at_the_gate_stated():
    """As the router states it: the engine's starvation bound counts from the gate."""
    engines = Engines("a", "a")
    directory = Directory(**ONE_SEAT)
    ingress = Ingress(engines, directory, IngressSettings())  # type: ignore[arg-type]
    unheld = await ingress(batch_chat("prog-1", "c1"))
    assert unheld.status_code == 200
    await left_the_gate(directory, in_flight=0)
    taken = await directory.directory.enter("taken", 1, "other")  # the one seat
    assert taken is not None
    waiting = asyncio.create_task(ingress(batch_chat("prog-1", "c2")))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if (await directory.directory.flow())["held"] == {"batch": 1}:
            break
    await asyncio.sleep(0.3)
    await directory.directory.leave(["taken"])
    assert (await waiting).status_code == 200
    unheld_identity, held_identity = engines.identities
    assert unheld_identity.router_wait_s is None
    assert held_identity.router_wait_s is not None and held_identity.router_wait_s >= 0.3
    assert held_identity.priority == 1  # still its band: the engine ages it
