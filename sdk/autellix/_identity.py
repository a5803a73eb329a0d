"""Who is calling: the program and thread that the running code belongs to.

The identity lives in a `contextvars.ContextVar`, so it follows the code the way
asyncio does: a task created with `asyncio.create_task` and a call made through
`asyncio.to_thread` see a copy of their creator's identity, while plain
`threading.Thread`s and executors start with none (see `_threads.bound`).

Ids are opaque strings. Thread ids may start with a readable name
(`search-1f0c...`) so server logs show which part of the agent made a call.
"""

from __future__ import annotations

import itertools
import os
import re
from contextvars import ContextVar, Token
from dataclasses import dataclass

_NOT_ID_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_MAX_NAME_CHARS = 40

# Every LLM call needs a fresh id, so ids are cheap: a random per-process
# prefix (64 bits from the OS) and a counter. The counter is a C iterator, so
# OS threads cannot get the same number; a forked child draws a new prefix.
_process_prefix = os.urandom(8).hex()
_counter = itertools.count()


def _new_process_prefix() -> None:
    global _process_prefix
    _process_prefix = os.urandom(8).hex()


os.register_at_fork(after_in_child=_new_process_prefix)


def new_id(name: str | None = None) -> str:
    """Return an id unique across processes, prefixed with `name` made header-safe."""
    unique = f"{_process_prefix}{next(_counter):x}"
    if not name:
        return unique
    readable = _NOT_ID_SAFE.sub("_", name)[:_MAX_NAME_CHARS].strip("_")
    return f"{readable}-{unique}" if readable else unique


@dataclass(frozen=True, slots=True)
class ThreadIdentity:
    """The program and thread that LLM calls made in this context belong to.

    `parent_thread_id` is None for a program's main thread and the forking
    thread's id for every other thread.
    """

    program_id: str
    thread_id: str
    parent_thread_id: str | None = None

    @classmethod
    def main_thread_of(cls, program_id: str) -> ThreadIdentity:
        """The identity of a newly opened program's main thread."""
        return cls(program_id=program_id, thread_id=new_id("main"))

    def child(self, name: str | None = None) -> ThreadIdentity:
        """A new thread of the same program, forked from this one."""
        return ThreadIdentity(self.program_id, new_id(name), parent_thread_id=self.thread_id)


_current: ContextVar[ThreadIdentity | None] = ContextVar("autellix_thread", default=None)


def current_identity() -> ThreadIdentity | None:
    """The identity of the running code, or None outside any program."""
    return _current.get()


def current_program() -> str | None:
    """The id of the program the running code belongs to, or None outside any program."""
    identity = _current.get()
    return identity.program_id if identity else None


def current_thread() -> str | None:
    """The id of the autellix thread the running code belongs to, or None outside any program."""
    identity = _current.get()
    return identity.thread_id if identity else None


def bind(identity: ThreadIdentity | None) -> Token[ThreadIdentity | None]:
    """Make `identity` current in this context; pass the token to `unbind` to undo it."""
    return _current.set(identity)


def unbind(token: Token[ThreadIdentity | None]) -> None:
    """Restore the identity that was current before the matching `bind`."""
    _current.reset(token)
