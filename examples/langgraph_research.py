"""A research agent as a LangGraph graph on ``langchain-openai``, as autellix programs.

    python examples/langgraph_research.py                  # autellix serve on 127.0.0.1:8000
    python examples/langgraph_research.py --agents 4 --passages 2

The task is ``research.py``'s, as a graph: the start fans out with ``Send``
to one ``read`` node per passage (LangGraph runs them at once, in one step),
and ``write`` answers from the notes the reads added to the state. What
autellix needs is two lines: ``ChatOpenAI`` gets the autellix client
(``autellix.langchain_clients``), and the function that invokes the graph is
a ``@program``. One graph run is then one program; the
parallel reads are sibling threads forked from its main thread
(docs/frameworks.md). LangGraph's own ``thread_id`` (a stored conversation of
a checkpointer) is a different thing and is not used here.
"""

from __future__ import annotations

import argparse
import operator
from typing import Annotated, Any, TypedDict

import autellix
import research as task
from _common import Endpoint, ProgramReport, run_example
from autellix import program
from knowledge_base import Passage
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Send


class ResearchState(TypedDict):
    question: str
    passages: list[Passage]
    notes: Annotated[list[str], operator.add]  # each read adds its note
    answer: str


class ReadTask(TypedDict):
    question: str
    passage: Passage


def build_graph(endpoint: Endpoint) -> CompiledStateGraph:
    """read (one per passage, in parallel) -> write."""
    clients = autellix.langchain_clients(endpoint.client)
    reader = ChatOpenAI(model=endpoint.model, max_tokens=task.READER_MAX_TOKENS, **clients)
    writer = ChatOpenAI(model=endpoint.model, max_tokens=task.WRITER_MAX_TOKENS, **clients)

    def fan_out(state: ResearchState) -> list[Send]:
        question = state["question"]
        return [Send("read", ReadTask(question=question, passage=p)) for p in state["passages"]]

    async def read(branch: ReadTask) -> dict[str, Any]:
        prompt = task.reader_prompt(branch["question"], branch["passage"])
        instructions = SystemMessage(task.READER_INSTRUCTIONS)
        reply = await reader.ainvoke([instructions, HumanMessage(prompt)])
        return {"notes": [reply.text]}

    async def write(state: ResearchState) -> dict[str, Any]:
        prompt = task.writer_prompt(state["question"], state["notes"])
        instructions = SystemMessage(task.WRITER_INSTRUCTIONS)
        reply = await writer.ainvoke([instructions, HumanMessage(prompt)])
        return {"answer": reply.text}

    graph = StateGraph(ResearchState)
    graph.add_node("read", read)
    graph.add_node("write", write)
    graph.add_conditional_edges(START, fan_out, ["read"])
    graph.add_edge("read", "write")
    graph.add_edge("write", END)
    return graph.compile()


@program(name="langgraph-research")
async def research(
    endpoint: Endpoint, question: str, passages: list[Passage], report: ProgramReport
) -> str:
    state = await build_graph(endpoint).ainvoke(
        {"question": question, "passages": passages, "notes": []}
    )
    await task.note_program(endpoint, report)
    return state["answer"].strip() or task.NO_ANSWER


async def main(args: argparse.Namespace, endpoint: Endpoint) -> list[ProgramReport]:
    return await task.run_research(args, endpoint, "langgraph", research)


def parser() -> argparse.ArgumentParser:
    return task.research_parser(__doc__ or "")


if __name__ == "__main__":
    raise SystemExit(run_example(parser(), main))
