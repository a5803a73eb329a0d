"""The ReAct agent's document tools: BM25 search, lookup by title, and the
sentence of a passage that answers a question.

The corpus (``data/saltmarrow.jsonl``, one ``{"title", "text"}`` object a line)
describes the Saltmarrow Isles, a place that does not exist, so a real model
has to use the tools instead of its memory to answer the questions in
``data/questions.jsonl`` (``{"question", "answer", "facts"}``: ``facts`` is 1
where one sentence of one passage holds the answer, 2 where it takes two facts
and arithmetic).
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from bm25 import BM25Index

DATA_DIR = Path(__file__).resolve().parent / "data"
CORPUS_PATH = DATA_DIR / "saltmarrow.jsonl"
QUESTIONS_PATH = DATA_DIR / "questions.jsonl"


@dataclass(frozen=True)
class Passage:
    title: str
    text: str


@dataclass(frozen=True)
class Question:
    question: str
    answer: str  # the expected answer, for scoring
    facts: int  # 1: one sentence holds the answer; 2: two facts and arithmetic


def read_jsonl(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def load_questions(path: Path = QUESTIONS_PATH) -> list[Question]:
    return [Question(row["question"], row["answer"], row["facts"]) for row in read_jsonl(path)]


class KnowledgeBase:
    """Passages searchable by content (BM25 over title and text) and by title."""

    def __init__(self, passages: list[Passage]) -> None:
        self.passages = passages
        self.index = BM25Index([f"{p.title}. {p.text}" for p in passages])
        self.title_index = BM25Index([p.title for p in passages])
        self._by_title = {_title_key(p.title): p for p in passages}

    @classmethod
    def load(cls, path: Path = CORPUS_PATH) -> KnowledgeBase:
        return cls([Passage(row["title"], row["text"]) for row in read_jsonl(path)])

    def search(self, query: str, k: int = 3) -> list[Passage]:
        """The ``k`` passages that match ``query`` best, best first."""
        return [self.passages[index] for index, _ in self.index.top(query, k)]

    def lookup(self, title: str) -> Passage | None:
        """The passage with this title (case and spacing ignored), if any."""
        return self._by_title.get(_title_key(title))

    def titles_for(self, question: str, k: int) -> list[str]:
        """Up to ``k`` titles of the passages ``question`` is about, best first: those
        whose titles share its words, then those whose texts do. A leading "The" is
        left out (small models pick "The ..." titles for its own sake; lookup does
        not need it)."""
        by_title = [self.passages[i] for i, _ in self.title_index.top(question, k)]
        by_text = self.search(question, k)
        found = dict.fromkeys(p.title for p in by_title + by_text)
        return [title.removeprefix("The ") for title in found][:k]

    def best_sentence(self, passage: Passage, question: str) -> str:
        """The sentence of ``passage`` that matches ``question`` best (BM25 over its
        sentences; the first sentence when none shares a word with it)."""
        sentences = split_sentences(passage.text)
        best = BM25Index(sentences).top(question, k=1)
        return sentences[best[0][0]] if best else sentences[0]

    def not_found(self, title: str) -> str:
        """What a lookup of a title no passage has says: the titles that come close."""
        similar = self.similar_titles(title)
        hint = f"; similar titles: {', '.join(similar)}" if similar else ""
        return f"no passage titled {title.strip()!r}{hint}"

    def similar_titles(self, title: str, n: int = 3) -> list[str]:
        keys = difflib.get_close_matches(_title_key(title), self._by_title, n=n, cutoff=0.5)
        return [self._by_title[key].title for key in keys]


def split_sentences(text: str) -> list[str]:
    return re.split(r"(?<=\.)\s+", text.strip())


def _title_key(title: str) -> str:
    """Case, spacing and a leading "the" do not matter: "the moot" is "The Moot"."""
    return " ".join(title.lower().split()).removeprefix("the ")
