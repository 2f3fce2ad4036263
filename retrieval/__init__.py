"""``memreader.retrieval`` (the ``retrieval/`` folder): retrieval over document memories and over conversations.

- ``memreader index`` / ``memreader ask`` (cli over search): the three-layer Milvus index (index, rows, lexical for
  BM25, updates; Milvus by URI: milvus, milvus_server), fused with RRF (:mod:`memreader.core.fusion`); ``ask
  --html``: audit_page;
- MeVe, ``ask --pipeline meve`` (meve, meve_settings, meve_sources, passages, verifier, verifier_calibration,
  meve_calibration, meve_audit);
- ``memreader chat``: momentary contexts rebuilt from stored turns (chat, momentary, conversation_store), budgets
  counted in the answering model's tokens (token_counter).

Public API::

    from memreader.retrieval import MemoryIndex, reciprocal_rank_fusion, ask, build_index_from_file, format_hits

Names resolve lazily, so ``from memreader.retrieval import reciprocal_rank_fusion`` does not pay for importing
pymilvus and torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Hit": "memreader.core.fusion",
    "LayerHit": "memreader.core.fusion",
    "reciprocal_rank_fusion": "memreader.core.fusion",
    "MODES": "memreader.retrieval.index",
    "BuildSummary": "memreader.retrieval.index",
    "MemoryIndex": "memreader.retrieval.index",
    "MemoryIndexError": "memreader.retrieval.index",
    "MeVePipeline": "memreader.retrieval.meve",
    "MeVeResult": "memreader.retrieval.meve",
    "MeVeSettings": "memreader.retrieval.meve",
    "MemoryChunkSource": "memreader.retrieval.meve",
    "PassageStore": "memreader.retrieval.passages",
    "CrossEncoderVerifier": "memreader.retrieval.verifier",
    "LMVerifier": "memreader.retrieval.verifier",
    "build_verifier": "memreader.retrieval.verifier",
    "RetrievalConfig": "memreader.retrieval.search",
    "ask": "memreader.retrieval.search",
    "build_index_from_file": "memreader.retrieval.search",
    "format_hits": "memreader.retrieval.search",
    "run_index": "memreader.retrieval.search",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
