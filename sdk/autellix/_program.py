"""Programs: `@program` and `session()` open a program, bind it, and end it.

Entering a program asks the server for a program id (one round trip), makes the
program's main thread current, and runs the user's code. Leaving it, by return,
exception or cancellation, restores the previous context and ends the program
on the server (best effort, bounded by a short timeout).

Entering a program while another one is running does not open a second program:
the inner one becomes a child thread of the outer program's current thread.

Which server: the client passed as `client=`, else the newest autellix client
of the matching kind (`AsyncOpenAI` for async code, `OpenAI` for sync code).
With no such client, or a server without the program API, the program runs
with a local id that calls still carry.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, ParamSpec, TypeVar, cast, overload

import openai

from ._client import newest_async_client, newest_sync_client
from ._hints import checked_priority
from ._hints import priority as hinted_priority
from ._identity import (
    BindToken,
    ThreadIdentity,
    bind,
    count_open_program,
    identity_in_context,
    new_id,
    unbind,
)
from ._once import warn_once
from ._programs_api import end_program, end_program_blocking, open_program, open_program_blocking
from ._threads import ThreadBlock

T = TypeVar("T")
P = ParamSpec("P")
AnyOpenAIClient = openai.AsyncOpenAI | openai.OpenAI


class ProgramSession:
    """A `with` / `async with` block that runs as an autellix program.

    The block yields the `ThreadIdentity` of its main thread, or of its child
    thread when it runs inside another program. Single use.
    """

    def __init__(self, name: str | None = None, *, client: AnyOpenAIClient | None = None) -> None:
        self._name = name
        self._client = client
        self._as_thread: ThreadBlock | None = None
        self._identity: ThreadIdentity | None = None
        self._token: BindToken | None = None
        # The client whose server opened the program; None for a local program.
        self._server: Any = None

    async def __aenter__(self) -> ThreadIdentity:
        if identity_in_context() is not None:
            return self._enter_as_thread()
        client = self._pick_client(openai.AsyncOpenAI, newest_async_client)
        program_id = await open_program(client, self._name) if client else None
        return self._enter_as_program(program_id, client)

    async def __aexit__(self, *exc_info: object) -> None:
        program_id = self._leave()
        if program_id is not None:
            await end_program(self._server, program_id)

    def __enter__(self) -> ThreadIdentity:
        if identity_in_context() is not None:
            return self._enter_as_thread()
        client = self._pick_client(openai.OpenAI, newest_sync_client)
        program_id = open_program_blocking(client, self._name) if client else None
        return self._enter_as_program(program_id, client)

    def __exit__(self, *exc_info: object) -> None:
        program_id = self._leave()
        if program_id is not None:
            end_program_blocking(self._server, program_id)

    def _pick_client(self, kind: type[Any], newest: Callable[[], Any]) -> Any:
        client = self._client if self._client is not None else newest()
        if client is not None and not isinstance(client, kind):
            raise TypeError(f"this program needs an {kind.__module__}.{kind.__name__} client")
        if client is None:
            _warn_no_client(kind)
        return client

    def _enter_as_thread(self) -> ThreadIdentity:
        self._as_thread = ThreadBlock(self._name)
        identity = self._as_thread.__enter__()
        assert identity is not None  # only called inside a program
        return identity

    def _enter_as_program(self, program_id: str | None, client: Any) -> ThreadIdentity:
        self._server = client if program_id is not None else None
        self._identity = ThreadIdentity.main_thread_of(program_id or new_id("local"))
        self._token = bind(self._identity)
        count_open_program(+1)
        return self._identity

    def _leave(self) -> str | None:
        """Restore the outer context; return the id of a program to end on the server."""
        if self._as_thread is not None:
            self._as_thread.__exit__(None, None, None)
            return None
        if self._token is not None:
            unbind(self._token)
            count_open_program(-1)
        if self._server is None or self._identity is None:
            return None
        return self._identity.program_id


def session(name: str | None = None, *, client: AnyOpenAIClient | None = None) -> ProgramSession:
    """A block that runs as a program: `async with autellix.session("name"):` (or `with`).

    Use it for agent code that is not one function. `client` picks the server
    that opens the program (default: the newest autellix client of the right kind).
    """
    return ProgramSession(name, client=client)


@overload
def program(fn: Callable[P, T], /) -> Callable[P, T]: ...


@overload
def program(
    *,
    name: str | None = None,
    client: AnyOpenAIClient | None = None,
    priority: str | int | None = None,
) -> Callable[[Callable[P, T]], Callable[P, T]]: ...


def program(
    fn: Callable[P, T] | None = None,
    /,
    *,
    name: str | None = None,
    client: AnyOpenAIClient | None = None,
    priority: str | int | None = None,
) -> Callable[P, T] | Callable[[Callable[P, T]], Callable[P, T]]:
    """Run every call of the decorated function as an autellix program.

    Works on `async def` and plain functions, as `@program` or
    `@program(name=..., client=..., priority=...)`; the program name defaults to
    the function's name. `priority` is the class its calls ask for, as in
    `autellix.priority` (None: whatever the caller's code asks for). Called
    inside another program, the function runs as a child thread (named after
    it) of the current thread instead.
    """
    asked = (
        nullcontext
        if priority is None
        else functools.partial(hinted_priority, checked_priority(priority))
    )

    def decorate(fn: Callable[P, T]) -> Callable[P, T]:
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError(
                "@autellix.program does not support generators; "
                "use `with autellix.session()` / `async with autellix.session()` inside them"
            )
        program_name = name or fn.__name__

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async_program(*args: P.args, **kwargs: P.kwargs) -> Any:
                async with ProgramSession(program_name, client=client):
                    with asked():
                        return await fn(*args, **kwargs)

            # T is the coroutine `fn` returns; the wrapper returns one of the same type.
            return cast(Callable[P, T], run_async_program)

        @functools.wraps(fn)
        def run_program(*args: P.args, **kwargs: P.kwargs) -> T:
            with ProgramSession(program_name, client=client), asked():
                return fn(*args, **kwargs)

        return run_program

    return decorate(fn) if fn is not None else decorate


def _warn_no_client(kind: type[Any]) -> None:
    warn_once(
        "no-client",
        "autellix: no autellix.%s exists yet, so programs run with local ids the "
        "server never opened; create the client first or pass client=",
        kind.__name__,
    )
