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

_EXPORTS = {name: f"memreader.{module}" for module, names in {
    "core.fusion": ("Hit", "LayerHit", "reciprocal_rank_fusion"),
    "retrieval.index": ("MODES", "BuildSummary", "MemoryIndex", "MemoryIndexError"),
    "retrieval.meve": ("MeVePipeline", "MeVeResult", "MeVeSettings", "MemoryChunkSource"),
    "retrieval.passages": ("PassageStore",),
    "retrieval.verifier": ("CrossEncoderVerifier", "LMVerifier", "build_verifier"),
    "retrieval.search": ("RetrievalConfig", "ask", "build_index_from_file", "format_hits", "run_index"),
}.items() for name in names}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
