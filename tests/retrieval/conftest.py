"""Fixtures for the retrieval tests: three hand-written memories (English and Chinese), the real
MiniLM embedder loaded once per session, one Milvus Lite index per module in ``tmp_path``, and the MeVe tests'
SmolLM2 tokenizer and passage store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.retrieval.retrieval_samples import CORPUS, MEMORIES


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


@pytest.fixture(scope="module")
def tokenizer(smollm2_path: str) -> Any:
    """The SmolLM2 tokenizer (MeVe's token counts)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, embedder: Any) -> Iterator[Any]:
    """A passage store over the MeVe :data:`CORPUS`; closed after the module."""
    from memreader.retrieval.passages import PassageStore

    db = tmp_path_factory.mktemp("passages") / "passages.db"
    with PassageStore.create(db, embedder=embedder) as built:
        assert built.build(CORPUS, embedder, embedder_name="minilm-l6", batch_size=8, progress=False) == len(CORPUS)
        assert built.count() == len(CORPUS)
        yield built
