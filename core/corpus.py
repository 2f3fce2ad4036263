"""Corpus JSONL: one document per line, ``{"id": ..., "text": ...}`` (field names configurable)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memreader.core.config import field as config_field
from memreader.core.errors import MemReaderError

DOCUMENT_SUFFIXES = (".pdf", ".docx", ".doc", ".html", ".htm", ".md", ".markdown", ".rtf", ".odt")
"""Files that are documents, not corpora: ``memreader ingest`` turns them into one."""


class CorpusError(MemReaderError, ValueError):
    """A corpus file is unreadable or a record lacks a field; the message names file and line."""


@dataclass
class CorpusConfig:
    """The corpus keys of a stage that reads one (``gen``, ``read``, ``read-dist``). A stage config names it first
    among its bases, so these keys come right before its own."""

    input: str = config_field("", help="corpus JSONL, one {'id','text'} per line")
    id_field: str = config_field("id", help="name of the id field in the corpus")
    text_field: str = config_field("text", help="name of the text field in the corpus")
    limit: int = config_field(0, ge=0, help="only the first N documents (0 = all)")

    def corpus_problems(self) -> list[str]:
        """The corpus keys' problem: no corpus given."""
        return [] if self.input else ["input: give a corpus JSONL path (input=...)"]

    def no_text(self, empty: list[str]) -> CorpusError:
        """The error of a corpus whose every document has empty text (``empty``: their ids)."""
        return CorpusError(f"every document of {self.input} has empty text ({len(empty)}: {empty[:5]})",
                           "give documents with text")


@dataclass
class Document:
    """One input document."""

    doc_id: str
    text: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def sha256(self) -> str:
        """Content hash; memories record it as ``source_sha256`` so a resumed run can tell changed text."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def iter_corpus(path: str | Path, id_field: str = "id", text_field: str = "text",
                limit: int | None = None) -> Iterator[Document]:
    """Documents of a JSONL corpus one at a time, read line by line (memory does not grow with the file, only
    the set of ids seen); duplicate ids, missing fields and bad bytes are errors naming file and line."""
    return (doc for doc, _, _ in iter_corpus_spans(path, id_field, text_field, limit))


def iter_corpus_spans(path: str | Path, id_field: str = "id", text_field: str = "text",
                      limit: int | None = None) -> Iterator[tuple[Document, int, int]]:
    """:func:`iter_corpus` with each record's line as byte offsets ``[start, end)`` of the file."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"corpus file {path} does not exist")
    if path.suffix.lower() in DOCUMENT_SUFFIXES:
        raise CorpusError(f"{path} is a {path.suffix.lower()[1:].upper()} file, not a corpus JSONL",
                          f"turn files into a corpus first: memreader ingest {path} (then read "
                          "runs/<run>/ingest/corpus.jsonl)")
    seen: set[str] = set()
    pos = 0
    with path.open("rb") as fh:
        for lineno, line in enumerate(fh, 1):
            start, pos = pos, pos + len(line)
            where = f"{path}:{lineno}"
            try:
                text_line = line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CorpusError(f"{where}: not UTF-8 (byte {exc.start}); re-encode the file as UTF-8") from None
            if not text_line.strip():
                continue
            try:
                rec = json.loads(text_line)
            except json.JSONDecodeError as exc:
                raise CorpusError(f"{where}: invalid JSON ({exc.msg}); is the file truncated?") from None
            if not isinstance(rec, dict):
                raise CorpusError(f"{where}: expected a JSON object per line")
            for name in (id_field, text_field):
                if name not in rec:
                    raise CorpusError(f"{where}: missing field {name!r} (set id_field/text_field to map your names)")
            if not isinstance(rec[text_field], str):
                raise CorpusError(f"{where}: field {text_field!r} must be a string, got "
                                  f"{type(rec[text_field]).__name__}")
            doc_id = str(rec[id_field])
            if doc_id in seen:
                raise CorpusError(f"{where}: duplicate id {doc_id!r}; ids must be unique for resuming to work")
            seen.add(doc_id)
            yield record_document(rec, id_field, text_field), start, pos
            if limit is not None and len(seen) >= limit:
                return
    if not seen:
        raise CorpusError(f"corpus file {path} holds no documents", f"add one JSON object per line with "
                          f"{id_field!r} and {text_field!r} fields")


def record_document(rec: dict[str, Any], id_field: str = "id", text_field: str = "text") -> Document:
    """The document of one corpus record: its id (as a string), its text, every other field as meta."""
    return Document(str(rec[id_field]), rec[text_field], {k: v for k, v in rec.items() if k not in (id_field, text_field)})


def read_corpus(path: str | Path, id_field: str = "id", text_field: str = "text",
                limit: int | None = None) -> list[Document]:
    """Every document of a JSONL corpus in a list (:func:`iter_corpus` for one at a time)."""
    return list(iter_corpus(path, id_field, text_field, limit))


def split_empty(docs: list[Document]) -> tuple[list[Document], list[str]]:
    """(documents with text, ids of those whose text is empty or only whitespace): empty documents
    are skipped before any model or paid call, and named in the run's summary."""
    kept = [d for d in docs if d.text.strip()]
    return kept, [d.doc_id for d in docs if not d.text.strip()]
