"""Chunking baselines as document memories, so every method goes through the same index and QA.

Only fixed-length chunking is here yet (the paper's ~180-character baseline); sentence-aware,
semantic and LLM chunkers plug into :data:`CHUNKERS` the same way.
"""

from __future__ import annotations

from collections.abc import Callable

from memreader.schema import DocumentMemory, Scenario


def fixed_length_spans(text: str, size: int = 180) -> list[tuple[int, int]]:
    """Consecutive ``size``-character spans that tile ``text`` (the last one may be shorter)."""
    if size < 1:
        raise ValueError(f"chunk size must be >= 1, got {size}")
    return [(i, min(i + size, len(text))) for i in range(0, len(text), size)]


def chunks_as_memory(doc_id: str, text: str, spans: list[tuple[int, int]], method: str) -> DocumentMemory:
    """A memory with chunks only (empty outline and core: the index skips those layers)."""
    mem = DocumentMemory(doc_id, text, [Scenario("", "", s, e) for s, e in spans], meta={"chunker": method})
    mem.validate()
    return mem


CHUNKERS: dict[str, Callable[[str], list[tuple[int, int]]]] = {
    "fixed-180": lambda text: fixed_length_spans(text, 180),
}


def baseline_memories(method: str, documents: dict[str, str]) -> list[DocumentMemory]:
    """Chunk every document with ``method`` (a key of :data:`CHUNKERS`)."""
    if method not in CHUNKERS:
        raise KeyError(f"unknown chunking baseline {method!r}; known: {', '.join(CHUNKERS)}")
    return [chunks_as_memory(d, t, CHUNKERS[method](t), method) for d, t in documents.items()]
