"""Fixtures for the data_gen tests (the fakes they share are in tests/data_gen/fakes.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.data_gen.fakes import DOCS


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    """:data:`DOCS` as ``tmp_path/corpus.jsonl``."""
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n" for i, t in DOCS))
    return path
