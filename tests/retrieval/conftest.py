"""Fixtures for the retrieval tests: three hand-written memories (English and Chinese), the real
MiniLM embedder loaded once per session, and one Milvus Lite index per module in ``tmp_path``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.retrieval.retrieval_samples import MEMORIES


@pytest.fixture(scope="session")
def embedder() -> Any:
    """The embedded all-MiniLM-L6-v2 model, loaded once."""
    from memreader.core.runtime import load_embedder

    return load_embedder("minilm-l6", device="cpu")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, embedder: Any) -> Iterator[tuple[Any, Any]]:
    """``(index, build summary)`` over :data:`MEMORIES` in a Milvus Lite file; closed after the module."""
    from memreader.retrieval.index import MemoryIndex

    db: Path = tmp_path_factory.mktemp("index") / "memories.db"
    index = MemoryIndex(db, embedder=embedder)
    try:
        summary = index.build(MEMORIES, embedder, batch_size=16, embedder_name="minilm-l6", progress=False)
        yield index, summary
    finally:
        index.close()
