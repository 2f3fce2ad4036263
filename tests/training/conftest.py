"""Fixtures for the training tests (the session home, SmolLM2 and the tiny random Llama live in
tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

ASSETS = Path(__file__).parent / "assets"


@pytest.fixture(scope="session")
def training_home(memreader_home: Path) -> Path:
    """The MEMREADER_HOME shared by every test of this session (see tests/conftest.py)."""
    return memreader_home


@pytest.fixture
def tiny_records() -> list[dict[str, Any]]:
    """The 4 records of tests/training/assets/tiny_sft.jsonl."""
    lines = (ASSETS / "tiny_sft.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


@pytest.fixture
def write_jsonl(tmp_path: Path):
    """Write records as ``tmp_path/<name>`` JSONL and return the path."""
    def _write(name: str, records: list[dict[str, Any]]) -> Path:
        path = tmp_path / name
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
        return path
    return _write


@pytest.fixture
def sft_files(tiny_records: list[dict[str, Any]], write_jsonl) -> tuple[Path, Path]:
    """train.jsonl (the 4 asset records repeated 4x with distinct ids) and val.jsonl (the 4 originals)."""
    repeated = [{**r, "id": f"{r['id']}-{k}"} for k in range(4) for r in tiny_records]
    return write_jsonl("train.jsonl", repeated), write_jsonl("val.jsonl", tiny_records)
