"""Retrieval over document memories: the three-layer Milvus index, rank fusion, search.

Public API::

    from retrieval import MemoryIndex, reciprocal_rank_fusion, ask, build_index_from_file, format_hits

Names resolve lazily, so ``from memreader.fusion import reciprocal_rank_fusion`` does not pay for
importing pymilvus and torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Hit": "memreader.fusion",
    "LayerHit": "memreader.fusion",
    "reciprocal_rank_fusion": "memreader.fusion",
    "MODES": "retrieval.index",
    "BuildSummary": "retrieval.index",
    "MemoryIndex": "retrieval.index",
    "MemoryIndexError": "retrieval.index",
    "MeVePipeline": "retrieval.meve",
    "MeVeResult": "retrieval.meve",
    "MeVeSettings": "retrieval.meve",
    "MemoryChunkSource": "retrieval.meve",
    "PassageStore": "retrieval.passages",
    "CrossEncoderVerifier": "retrieval.verifier",
    "LMVerifier": "retrieval.verifier",
    "build_verifier": "retrieval.verifier",
    "RetrievalConfig": "retrieval.search",
    "ask": "retrieval.search",
    "build_index_from_file": "retrieval.search",
    "format_hits": "retrieval.search",
    "run_ask": "retrieval.search",
    "run_index": "retrieval.search",
    "run_meve_ask": "retrieval.search",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'retrieval' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
