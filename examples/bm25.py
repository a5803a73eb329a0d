"""Okapi BM25 ranking over a small in-memory collection.

    index = BM25Index(["the cat sat", "a dog barked at the cat"])
    index.top("cat", k=1)   # [(0, 0.29...)]: the shorter document that says "cat"

For a query q with terms t and a document d of |d| terms (avgdl: the mean
length):

    score(q, d) = sum over t of  idf(t) * tf(t, d) * (k1 + 1)
                                 / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
    idf(t)      = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))

with N documents, df(t) of which contain t. The ``1 +`` keeps idf positive
for terms that occur in most documents (Lucene's variant). k1 limits how much
repeating a term helps; b is how strongly long documents are normalised.
"""

from __future__ import annotations

import math
import re
from collections import Counter

# Words that carry no topic; kept out of the index and the queries.
_STOPWORD_TEXT = """a an and are as at be by for from has have in is it its of on or that
the their there this to was were which with how many much what when where who"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())
_WORD = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    """Lower-case words and numbers, without stopwords; a trailing plural ``s`` is dropped
    so that "stones" finds "stone" (and "1,400" is the term "1400")."""
    words = _WORD.findall(text.lower().replace(",", ""))
    return [_singular(word) for word in words if word not in STOPWORDS]


def _singular(word: str) -> str:
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


class BM25Index:
    """BM25 scores of queries against a fixed list of documents."""

    def __init__(self, documents: list[str], k1: float = 1.5, b: float = 0.75) -> None:
        self.k1 = k1
        self.b = b
        self.term_counts = [Counter(tokenize(document)) for document in documents]
        self.lengths = [sum(counts.values()) for counts in self.term_counts]
        # (1.0 when there are no words at all: then every score is 0 anyway.)
        self.mean_length = sum(self.lengths) / len(self.lengths) if any(self.lengths) else 1.0
        document_frequency = Counter(term for counts in self.term_counts for term in counts)
        total = len(documents)
        self.idf = {
            term: math.log(1 + (total - df + 0.5) / (df + 0.5))
            for term, df in document_frequency.items()
        }

    def __len__(self) -> int:
        return len(self.term_counts)

    def scores(self, query: str) -> list[float]:
        """One score per document, in document order (0 when no query term occurs)."""
        terms = [term for term in set(tokenize(query)) if term in self.idf]
        return [self._score(terms, counts, length) for counts, length in
                zip(self.term_counts, self.lengths, strict=True)]  # fmt: skip

    def top(self, query: str, k: int = 3) -> list[tuple[int, float]]:
        """The ``k`` best ``(document index, score)`` pairs with a positive score,
        best first; ties keep document order."""
        ranked = sorted(enumerate(self.scores(query)), key=lambda pair: -pair[1])
        return [(index, score) for index, score in ranked[:k] if score > 0]

    def _score(self, terms: list[str], counts: Counter[str], length: int) -> float:
        normaliser = self.k1 * (1 - self.b + self.b * length / self.mean_length)
        total = 0.0
        for term in terms:
            frequency = counts.get(term, 0)
            if frequency:
                total += self.idf[term] * frequency * (self.k1 + 1) / (frequency + normaliser)
        return total
