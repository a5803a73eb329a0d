"""BM25 ranking and the ReAct agent's document tools over the shipped corpus."""

from __future__ import annotations

import math

import pytest
from bm25 import BM25Index, tokenize
from knowledge_base import KnowledgeBase, load_questions


@pytest.fixture(scope="module")
def knowledge() -> KnowledgeBase:
    return KnowledgeBase.load()


def test_tokenize_lowercases_drops_stopwords_and_plural_s():
    assert tokenize("The Morrow Stones, raised in 2500 BC!") == [
        "morrow", "stone", "raised", "2500", "bc",
    ]  # fmt: skip
    assert tokenize("1,400 seals") == ["1400", "seal"]
    assert tokenize("glass") == ["glass"]


def test_bm25_prefers_the_document_that_repeats_a_rare_term():
    index = BM25Index(["apple banana", "apple apple cherry", "banana cherry"])
    assert [doc for doc, _ in index.top("apple")] == [1, 0]
    assert index.top("durian") == []  # unknown terms score nothing


def test_bm25_prefers_rare_terms_and_shorter_documents():
    index = BM25Index(["cat dog", "cat fish", "cat bird", "dog dog dog dog dog dog dog mouse"])
    # "mouse" occurs once, "cat" three times: the rare term decides.
    assert index.top("cat mouse", k=1)[0][0] == 3
    short_long = BM25Index(["cat", "cat dog fish bird horse", "other"])
    scores = short_long.scores("cat")
    assert scores[0] > scores[1] > 0 == scores[2]


def test_bm25_scores_match_the_formula():
    index = BM25Index(["the cat sat", "a dog barked at the cat"], k1=1.5, b=0.75)
    idf = math.log(1 + (2 - 2 + 0.5) / (2 + 0.5))
    mean_length = (2 + 3) / 2
    expected = idf * 2.5 / (1 + 1.5 * (1 - 0.75 + 0.75 * 2 / mean_length))
    assert index.scores("cat")[0] == pytest.approx(expected)
    assert index.top("cat", k=1) == [(0, pytest.approx(expected))]


def test_bm25_empty_and_degenerate_input():
    assert BM25Index([]).top("anything") == []
    index = BM25Index(["", "the of and"])
    assert index.scores("the") == [0.0, 0.0]
    assert index.top("") == []


@pytest.mark.parametrize(
    ("query", "title"),
    [
        ("When was Port Ellery founded?", "Port Ellery"),
        ("lighthouse automated", "Skerry Light"),
        ("Comet Venn return period", "Comet Venn"),
        ("height of Beacon Tor", "Beacon Tor"),
        ("fleece of the Wren Dun sheep", "Wren Dun sheep"),
        ("currency mainland marks", "Saltmarrow crown"),
        ("standing stones", "Morrow Stones"),
    ],
)
def test_search_finds_the_passage_that_answers(knowledge, query, title):
    assert knowledge.search(query, k=3)[0].title == title


def test_search_of_junk_finds_nothing(knowledge):
    assert knowledge.search("zzqx ~!@#$%^&*") == []
    assert knowledge.search("") == []


def test_lookup_by_title_ignores_case_and_spacing(knowledge):
    passage = knowledge.lookup("  skerry   LIGHT ")
    assert passage is not None and "1832" in passage.text
    assert knowledge.lookup("Atlantis") is None
    assert knowledge.similar_titles("Skerry Lite")[0] == "Skerry Light"
    assert knowledge.similar_titles("~~~") == []


def test_corpus_and_questions_are_consistent(knowledge):
    assert 30 <= len(knowledge.passages) <= 60
    assert len({p.title for p in knowledge.passages}) == len(knowledge.passages)
    questions = load_questions()
    assert len(questions) >= 8
    for question in questions:
        float(question.answer)  # every expected answer is a number the agent can compute
