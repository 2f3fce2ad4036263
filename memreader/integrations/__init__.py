"""MemReader indexes as retrievers of the RAG frameworks people already use (optional extras).

    pip install 'memreader[langchain]'      from memreader.integrations.langchain import MemReaderRetriever
    pip install 'memreader[llamaindex]'     from memreader.integrations.llamaindex import MemReaderRetriever

Both wrap a :class:`memreader.api.Index` and return each retrieved chunk (an exact span of its document) with the
same metadata: :func:`hit_metadata`, as :func:`retrieve` finds them.
"""

from __future__ import annotations

from typing import Any

from memreader.core.fusion import CORE, OUTLINE, Hit

__all__ = ["hit_metadata", "retrieve"]


def hit_metadata(hit: Hit, layers: dict[str, str] | None = None) -> dict[str, Any]:
    """What a framework document carries besides the chunk text; ``layers``: the outline item and core content of
    its scenario (:meth:`memreader.api.Index.layer_texts`; else what the voting rows hold)."""
    texts = {p.base_layer: p.text for p in hit.provenance} | (layers or {})
    where = hit.where or {}
    return {"doc_id": hit.doc_id, "scenario": hit.scenario, "start": hit.start, "end": hit.end,
            "score": hit.score, "layers": hit.layers, "outline": texts.get(OUTLINE), "core": texts.get(CORE),
            "source": where.get("source"), "pages": list(where.get("pages") or []),
            "headings": list(where.get("headings") or [])}


def retrieve(index: Any, query: str, top_k: int, mode: str) -> list[tuple[Hit, str, dict[str, Any]]]:
    """``(hit, its stable id <doc_id>#<scenario>, hit_metadata(hit, its layers))`` for the ``top_k`` chunks an open
    :class:`memreader.api.Index` finds for ``query``; ``mode`` is any search mode of the index (``three_layer``,
    ``single``, ``chunk_only``, ``hybrid``, ``chunk_hybrid``)."""
    hits = index.search(query, top_k=top_k, mode=mode)
    layers = index.layer_texts(hits)
    return [(h, f"{h.doc_id}#{h.scenario}", hit_metadata(h, layers[(h.doc_id, h.scenario)])) for h in hits]
