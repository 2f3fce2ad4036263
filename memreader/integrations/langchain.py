"""A LangChain retriever over a MemReader index (``pip install 'memreader[langchain]'``).

    from memreader import api
    from memreader.integrations.langchain import MemReaderRetriever

    retriever = MemReaderRetriever(index=api.open_index(run="docs"), top_k=4, mode="hybrid")
    docs = retriever.invoke("What changed in the third quarter?")
    docs[0].page_content, docs[0].metadata["pages"], docs[0].metadata["outline"]

One ``Document`` per retrieved chunk; details: docs/USAGE.md (Looking at memories: LangChain and LlamaIndex).
"""

from __future__ import annotations

from typing import Any

try:
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("the LangChain retriever needs langchain-core: pip install 'memreader[langchain]'") from exc

from memreader.integrations import retrieve

__all__ = ["MemReaderRetriever"]


class MemReaderRetriever(BaseRetriever):
    """LangChain ``Document`` s of the ``top_k`` MemReader chunks for a query in search ``mode`` (:func:`retrieve`)."""

    index: Any
    """An open :class:`memreader.api.Index`."""
    top_k: int = 8
    mode: str = "three_layer"

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return [Document(page_content=h.text, id=id_, metadata=meta)
                for h, id_, meta in retrieve(self.index, query, self.top_k, self.mode)]
