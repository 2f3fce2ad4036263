"""Shared fixtures for the eval tests: the hand-written data-set fixtures in tests/assets/ (what the default tests
read), the full public copies in ../shared (opt-in, ``-m slow``), and Chinese (prediction, reference) pairs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ASSETS = REPO / "tests" / "assets"
SHARED = (REPO / ".." / "shared").resolve()


def shared_folder(name: str) -> Path:
    """``../shared/<name>`` next to the repository (the offline public data sets and paper texts, see
    docs/EVALUATION.md); the opt-in test that needs it is skipped, with this reason, where it is absent."""
    folder = SHARED / name
    if not folder.is_dir():
        pytest.skip(f"{folder} is not here: this opt-in test reads the full public copies kept next to the "
                    "repository; the default tests use tests/assets/")
    return folder


def _opt_in(request: pytest.FixtureRequest, name: str) -> Path:
    if request.node.get_closest_marker("slow") is None:
        pytest.fail(f"{request.node.nodeid} reads ../shared/{name} but is not marked slow: a default test reads "
                    "tests/assets/ only, so that `make test` passes without ../shared")
    return shared_folder(name)


@pytest.fixture
def shared(request: pytest.FixtureRequest) -> Path:
    """``../shared/datasets``, for tests marked ``slow`` only."""
    return _opt_in(request, "datasets")


@pytest.fixture
def shared_papers(request: pytest.FixtureRequest) -> Path:
    """``../shared/papers`` (the source papers' texts), for tests marked ``slow`` only."""
    return _opt_in(request, "papers")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module", params=["assets", pytest.param("shared", marks=pytest.mark.slow)])
def crud_records(request: pytest.FixtureRequest) -> list[dict]:
    """CRUD-RAG event-summary records: the 12 hand-written ones in tests/assets/ (default) or, opt-in, the 1,328
    of ../shared/datasets. A test reads which from ``request.node.callspec.params["crud_records"]``."""
    if request.param == "assets":
        return read_jsonl(ASSETS / "crud_event_summary_small.jsonl")
    return read_jsonl(shared_folder("datasets") / "crud_event_summary.jsonl")


@pytest.fixture(scope="module")
def zh_pairs(crud_records: list[dict]) -> tuple[list[str], list[str]]:
    """Chinese (prediction, reference) pairs: each record's ``event`` against its ``summary``."""
    return [r["event"] for r in crud_records], [r["summary"] for r in crud_records]


@pytest.fixture(scope="session")
def longbench_contexts() -> dict[str, str]:
    """``_id -> context`` of tests/assets/longbench_multifieldqa_zh_small.jsonl (two of ~1,200 characters)."""
    return {r["_id"]: r["context"] for r in read_jsonl(ASSETS / "longbench_multifieldqa_zh_small.jsonl")}
