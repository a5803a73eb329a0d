"""autellix client SDK: run an LLM agent as one program the server can schedule.

Two-line migration::

    from autellix import AsyncOpenAI, program      # was: from openai import AsyncOpenAI

    @program                                        # new
    async def agent(task: str) -> str: ...          # unchanged body

Every LLM call made inside `agent` carries its program and thread identity in
HTTP headers; each task that `asyncio.gather`, `create_task` or a `TaskGroup`
starts in it is a thread of its own. See docs/sdk.md.
"""

from ._client import AsyncOpenAI, OpenAI
from ._hints import expect_tool, priority
from ._identity import ThreadIdentity, current_identity, current_program, current_thread
from ._langchain import langchain_clients
from ._program import ProgramSession, program, session
from ._retry import TRANSIENT_STATUS_CODES
from ._tagging import (
    CALL_ID_HEADER,
    PARENT_THREAD_ID_HEADER,
    PRIORITY_HEADER,
    PROGRAM_ID_HEADER,
    RETENTION_TTL_HEADER,
    SESSION_ID_HEADER,
    THREAD_ID_HEADER,
)
from ._threads import ThreadBlock, bound, create_task, fork, forked, gather, thread

__all__ = [
    "AsyncOpenAI",
    "OpenAI",
    "program",
    "session",
    "ProgramSession",
    "fork",
    "create_task",
    "gather",
    "thread",
    "ThreadBlock",
    "forked",
    "bound",
    "expect_tool",
    "priority",
    "langchain_clients",
    "current_program",
    "current_thread",
    "current_identity",
    "ThreadIdentity",
    "PROGRAM_ID_HEADER",
    "THREAD_ID_HEADER",
    "PARENT_THREAD_ID_HEADER",
    "CALL_ID_HEADER",
    "SESSION_ID_HEADER",
    "RETENTION_TTL_HEADER",
    "PRIORITY_HEADER",
    "TRANSIENT_STATUS_CODES",
]
