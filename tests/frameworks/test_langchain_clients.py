"""autellix.langchain_clients: ChatOpenAI keeps the autellix clients it is given,
and anything but one autellix client of each kind is refused with a clear error."""

from __future__ import annotations

import openai
import pytest
from autellix import AsyncOpenAI, OpenAI, langchain_clients
from langchain_openai import ChatOpenAI

URL = "http://127.0.0.1:9/v1"


def test_chat_openai_calls_through_the_clients_it_is_given():
    async_client = AsyncOpenAI(base_url=URL, api_key="k")
    sync_client = OpenAI(base_url=URL, api_key="k")
    llm = ChatOpenAI(model="m", **langchain_clients(async_client, sync_client))
    assert llm.root_async_client is async_client and llm.root_client is sync_client
    assert llm.async_client is async_client.chat.completions
    assert llm.client is sync_client.chat.completions


def test_one_kind_leaves_the_other_to_chat_openai():
    client = AsyncOpenAI(base_url=URL, api_key="k")
    assert langchain_clients(client) == {
        "root_async_client": client,
        "async_client": client.chat.completions,
    }


def test_a_plain_openai_client_or_none_or_two_of_a_kind_is_refused():
    with pytest.raises(TypeError, match=r"not openai\.(_client\.)?AsyncOpenAI"):
        langchain_clients(openai.AsyncOpenAI(base_url=URL, api_key="k"))
    with pytest.raises(ValueError, match="needs an autellix"):
        langchain_clients()
    client = AsyncOpenAI(base_url=URL, api_key="k")
    with pytest.raises(ValueError, match="two AsyncOpenAI clients"):
        langchain_clients(client, client)
