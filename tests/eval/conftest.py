"""Shared fixtures for the eval tests: the offline datasets folder and real Chinese pairs from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED = (REPO / ".." / "shared" / "datasets").resolve()


@pytest.fixture(scope="session")
def shared() -> Path:
    """``../shared/datasets`` next to the repository; CI has it, so its absence is a failure."""
    if not SHARED.is_dir():
        pytest.fail(
            f"offline datasets folder {SHARED} is missing: the eval tests read the public benchmark copies "
            "kept there (see docs/EVALUATION.md, 'Datasets available offline')"
        )
    return SHARED


@pytest.fixture(scope="session")
def crud_records(shared: Path) -> list[dict]:
    """The 1,328 CRUD-RAG event-summary records."""
    path = shared / "crud_event_summary.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="session")
def real_pairs(crud_records: list[dict]) -> tuple[list[str], list[str]]:
    """Real Chinese (prediction, reference) pairs: each record's ``event`` against its ``summary``."""
    return [r["event"] for r in crud_records], [r["summary"] for r in crud_records]
