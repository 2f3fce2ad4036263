"""Where MeVe retrieves from: the :class:`PassageSource` protocol and the chunk layer of a memory index as one.

    source = MemoryChunkSource(index)          # or a memreader.retrieval.passages.PassageStore
    pipeline = MeVePipeline(source, embedder, verifier, tokenizer, settings)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from memreader.core.errors import MemReaderError
from memreader.retrieval.passages import PassageHit
from memreader.retrieval.rows import primary_key

__all__ = ["MeVeError", "MemoryChunkSource", "PassageSource"]


class MeVeError(MemReaderError, ValueError):
    """A MeVe setting, question or passage source cannot be used."""


class PassageSource(Protocol):
    """Where MeVe retrieves from: dense kNN, BM25, and stored vectors by id."""

    def knn(self, vector: Sequence[float], k: int) -> list[PassageHit]:
        """The ``k`` nearest passages, best first, with their stored vectors if the source has them at hand (phase 4
        reads missing ones through :meth:`vectors`). A source whose ``knn`` also takes ``with_vectors`` is searched
        with ``with_vectors=False`` beside a slow verifier, which then reads the vectors while it scores."""
        ...

    def bm25(self, query: str, k: int) -> list[PassageHit]: ...

    def vectors(self, ids: Sequence[str]) -> dict[str, np.ndarray]: ...


class MemoryChunkSource:
    """The chunk layer of a :class:`~memreader.retrieval.index.MemoryIndex` as a MeVe passage source.

    Passage ids are the chunk rows' primary keys (``chunk/<scenario>/<version>/<doc_id>``); vectors for the
    redundancy check are the stored chunk vectors, read by primary key (no re-embedding).
    """

    def __init__(self, index: Any) -> None:
        self.index = index

    @staticmethod
    def _hit(h: Any) -> PassageHit:
        return PassageHit(id=primary_key("chunk", h.scenario, h.doc_id, h.version), doc_id=h.doc_id, text=h.text,
                          rank=h.rank, score=h.similarity, where=h.where)

    def knn(self, vector: Sequence[float], k: int) -> list[PassageHit]:
        """The ``k`` nearest chunks (cosine), best first, without vectors (phase 4 reads them by primary key)."""
        if len(vector) != self.index.meta["dim"]:
            raise MeVeError(f"the query vector has {len(vector)} dimensions, the index {self.index.meta['dim']}",
                            f"embed the question with {self.index.meta['embedder']!r}")
        return [self._hit(h) for h in self.index.search_layer(vector, "chunk", k)]

    def bm25(self, query: str, k: int) -> list[PassageHit]:
        """The ``k`` best chunks by BM25, best first."""
        return [self._hit(h) for h in self.index.search_bm25(query, "chunk", k)]

    def vectors(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        """Stored chunk vectors by primary key."""
        return self.index.stored_vectors(ids, self.index.REBUILD_FIX)
