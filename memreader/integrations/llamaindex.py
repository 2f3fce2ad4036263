"""A LlamaIndex retriever over a MemReader index (``pip install 'memreader[llamaindex]'``).

    from memreader import api
    from memreader.integrations.llamaindex import MemReaderRetriever

    retriever = MemReaderRetriever(api.open_index(run="docs"), top_k=4, mode="hybrid")
    nodes = retriever.retrieve("What changed in the third quarter?")
    nodes[0].node.text, nodes[0].score, nodes[0].node.metadata["headings"]

One ``NodeWithScore`` per retrieved chunk; details: docs/USAGE.md (Looking at memories: LangChain and LlamaIndex).
"""

from __future__ import annotations

from typing import Any

try:
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("the LlamaIndex retriever needs llama-index-core: pip install 'memreader[llamaindex]'") from exc

from memreader.integrations import retrieve

__all__ = ["MemReaderRetriever"]


class MemReaderRetriever(BaseRetriever):
    """LlamaIndex nodes of the ``top_k`` MemReader chunks for a query in search ``mode`` (:func:`retrieve`)."""

    def __init__(self, index: Any, top_k: int = 8, mode: str = "three_layer", **kwargs: Any) -> None:
        self.index, self.top_k, self.mode = index, top_k, mode
        super().__init__(**kwargs)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [NodeWithScore(node=TextNode(text=h.text, id_=id_, metadata=meta), score=h.score)
                for h, id_, meta in retrieve(self.index, query_bundle.query_str, self.top_k, self.mode)]
