"""LangChain's `ChatOpenAI` (package `langchain-openai`) with autellix clients.

`ChatOpenAI` builds openai clients of its own from `base_url` and `api_key`,
unless it is given, for each of async and sync code, both a root client and
that client's `chat.completions` resource. Those calls would carry no identity.
`langchain_clients` returns the four keyword arguments for the clients you
pass, so that LangChain and LangGraph call through them:

    llm = ChatOpenAI(model=MODEL, **autellix.langchain_clients(client))

Nothing here imports LangChain: the SDK works without it installed.
"""

from __future__ import annotations

from typing import Any

from ._client import AsyncOpenAI, OpenAI


def langchain_clients(*clients: AsyncOpenAI | OpenAI) -> dict[str, Any]:
    """`ChatOpenAI` keyword arguments that make it call through these autellix clients.

    Pass an `autellix.AsyncOpenAI` for async code (`ainvoke`, `astream`, an async
    LangGraph graph), an `autellix.OpenAI` for sync code (`invoke`), or one of
    each. A kind you do not pass is left to `ChatOpenAI`, which builds a plain
    openai client for it.

    Raises `TypeError` for a client that is not an autellix client (its calls
    would carry no program identity) and `ValueError` for no client or two of
    one kind.
    """
    if not clients:
        raise ValueError("langchain_clients() needs an autellix.AsyncOpenAI or autellix.OpenAI")
    arguments: dict[str, Any] = {}
    for client in clients:
        if isinstance(client, AsyncOpenAI):
            root, resource = "root_async_client", "async_client"
        elif isinstance(client, OpenAI):
            root, resource = "root_client", "client"
        else:
            raise TypeError(
                "langchain_clients() takes autellix.AsyncOpenAI and autellix.OpenAI clients, "
                f"not {type(client).__module__}.{type(client).__qualname__}"
            )
        if root in arguments:
            raise ValueError(f"langchain_clients() got two {type(client).__name__} clients")
        arguments[root] = client
        arguments[resource] = client.chat.completions
    return arguments
