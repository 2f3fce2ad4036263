"""Deprecated: the chunkers live in :mod:`eval.chunkers` (``method_memories``, calibrated lengths).

Kept as a thin re-export for ``eval/qa.py``, ``scripts/bench_embedders.py`` and their tests until
they switch to :func:`eval.chunkers.method_memories`; ``fixed-180`` is the uncalibrated fixed baseline.
"""

from __future__ import annotations

from collections.abc import Callable

from eval.chunkers import chunks_as_memory, fixed_length_spans
from memreader.schema import DocumentMemory

__all__ = ["CHUNKERS", "baseline_memories", "chunks_as_memory", "fixed_length_spans"]

CHUNKERS: dict[str, Callable[[str], list[tuple[int, int]]]] = {
    "fixed-180": lambda text: fixed_length_spans(text, 180),
}


def baseline_memories(method: str, documents: dict[str, str]) -> list[DocumentMemory]:
    """Chunk every document with ``method`` (a key of :data:`CHUNKERS`)."""
    if method not in CHUNKERS:
        raise KeyError(f"unknown chunking baseline {method!r}; known: {', '.join(CHUNKERS)}")
    return [chunks_as_memory(d, t, CHUNKERS[method](t), method) for d, t in documents.items()]
