"""Corpus JSONL read lazily: one document at a time, the same errors naming file and line, nothing past the limit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memreader.core.corpus import CorpusError, iter_corpus, read_corpus


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_iter_corpus_is_lazy_and_stops_at_the_limit(tmp_path: Path) -> None:
    good = [json.dumps({"id": f"d{i}", "text": f"text {i}", "lang": "en"}) for i in range(3)]
    path = _write(tmp_path / "c.jsonl", [*good, "{not json"])
    docs = iter_corpus(path)
    first = next(docs)
    assert (first.doc_id, first.text, first.meta) == ("d0", "text 0", {"lang": "en"})
    assert [d.doc_id for d in read_corpus(path, limit=3)] == ["d0", "d1", "d2"]  # the broken line is never read
    with pytest.raises(CorpusError, match=r"c.jsonl:4: invalid JSON"):
        list(docs)


@pytest.mark.parametrize(("lines", "error"), [
    (['{"id": "a", "text": "x"}', '{"id": "a", "text": "y"}'], r":2: duplicate id 'a'"),
    (['{"id": "a"}'], r":1: missing field 'text'"),
    (['["a"]'], r":1: expected a JSON object"),
    (["", "  "], "holds no documents"),
])
def test_iter_corpus_errors_name_the_line(tmp_path: Path, lines: list[str], error: str) -> None:
    with pytest.raises(CorpusError, match=error):
        list(iter_corpus(_write(tmp_path / "c.jsonl", lines)))


def test_bad_bytes_and_document_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"id": "a", "text": "ok"}\n{"id": "b", "text": "\xff"}\n')
    with pytest.raises(CorpusError, match=r"c.jsonl:2: not UTF-8"):
        list(iter_corpus(path))
    pdf = tmp_path / "report.pdf"
    pdf.write_bytes(b"%PDF-1.4")
    with pytest.raises(CorpusError, match="memreader ingest"):
        next(iter_corpus(pdf))
