"""Document-memory schema and its JSONL reader/writer (the record: docs/ARCHITECTURE.md, "Document memory").

A :class:`DocumentMemory` holds the document text, one :class:`Scenario` per atomic chunk
(outline item, core content, exact ``[start, end)`` span) and optional reasoning. The invariant
checked on every write: spans are ordered, do not overlap and tile the whole document, so that
no character of the document is lost or invented.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from memreader.core.errors import MemReaderError

SCHEMA_VERSION = 1


class MemoryValidationError(MemReaderError, ValueError):
    """A document memory breaks the schema or the tiling invariant."""


@dataclass
class Scenario:
    """One scenario of a memory: an outline topic, its core content and its chunk span."""

    outline: str
    core: str
    start: int
    end: int


@dataclass
class DocumentMemory:
    """``M = {O, C, A}`` for one document, plus optional reasoning ``P`` and metadata."""

    doc_id: str
    document: str
    scenarios: list[Scenario]
    reasoning: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def outline(self) -> list[str]:
        """The outline ``O``: one topic per scenario, in document order."""
        return [s.outline for s in self.scenarios]

    @property
    def cores(self) -> list[str]:
        """The core contents ``C``."""
        return [s.core for s in self.scenarios]

    @property
    def chunks(self) -> list[str]:
        """The atomic chunks ``A``: exact slices of the document."""
        return [self.document[s.start : s.end] for s in self.scenarios]

    def validate(self) -> None:
        """Raise :class:`MemoryValidationError` unless the spans tile the document exactly."""
        problems = tiling_problems([(s.start, s.end) for s in self.scenarios], len(self.document))
        if not isinstance(self.doc_id, str) or not self.doc_id:
            problems.insert(0, f"doc_id must be a non-empty string, got {self.doc_id!r}")
        if problems:
            raise MemoryValidationError(f"memory {self.doc_id!r}: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        """Serialisable form; the outline is written too, for readers of the raw JSONL."""
        return {"schema_version": SCHEMA_VERSION, "doc_id": self.doc_id, "document": self.document,
                "outline": self.outline, "scenarios": [asdict(s) for s in self.scenarios], "reasoning": self.reasoning,
                "meta": self.meta}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "<dict>") -> DocumentMemory:
        """Build and validate a memory from :meth:`to_dict` output; errors name ``where``."""
        if not isinstance(data, dict):
            raise MemoryValidationError(f"{where}: expected a JSON object, got {type(data).__name__}")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise MemoryValidationError(f"{where}: schema_version {version!r} is not supported (expected "
                                        f"{SCHEMA_VERSION}); regenerate the memories with this version of memreader")
        missing = [k for k in ("doc_id", "document", "scenarios") if k not in data]
        if missing:
            raise MemoryValidationError(f"{where}: missing field(s) {', '.join(missing)}")
        try:
            scenarios = [Scenario(str(s["outline"]), str(s["core"]), int(s["start"]), int(s["end"]))
                         for s in data["scenarios"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise MemoryValidationError(f"{where}: bad scenario ({exc!r}); each needs outline, core, start, "
                                        "end") from exc
        mem = cls(str(data["doc_id"]), str(data["document"]), scenarios, data.get("reasoning"),
                  dict(data.get("meta") or {}))
        outline = data.get("outline")
        if outline is not None and list(outline) != mem.outline:
            raise MemoryValidationError(f"{where}: 'outline' disagrees with the scenarios' outline items")
        try:
            mem.validate()
        except MemoryValidationError as exc:
            raise MemoryValidationError(f"{where}: {exc}") from None
        return mem


def tiling_problems(spans: list[tuple[int, int]], length: int) -> list[str]:
    """Describe every way ``spans`` fail to tile ``[0, length)``; empty when they do."""
    problems: list[str] = []
    if not spans:
        if length:
            problems.append(f"no spans for a document of {length} characters")
        return problems
    if spans[0][0] != 0:
        problems.append(f"first span starts at {spans[0][0]}, not 0")
    for i, (start, end) in enumerate(spans):
        if end <= start:
            problems.append(f"span {i} [{start}, {end}) is empty or reversed")
        if i and start != spans[i - 1][1]:
            kind = "gap" if start > spans[i - 1][1] else "overlap"
            problems.append(f"{kind} between span {i - 1} (ends {spans[i - 1][1]}) and span {i} (starts {start})")
    if spans[-1][1] != length:
        problems.append(f"last span ends at {spans[-1][1]}, document has {length} characters")
    return problems


def write_memories(path: str | Path, memories: Iterable[DocumentMemory], append: bool = False) -> int:
    """Validate and write memories as JSONL; returns how many were written.

    Each memory is validated before its line is written, so a bad memory never reaches disk and
    the lines already written stay intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("a" if append else "w", encoding="utf-8") as fh:
        for mem in memories:
            mem.validate()
            fh.write(json.dumps(mem.to_dict(), ensure_ascii=False) + "\n")
            fh.flush()
            n += 1
    return n


def iter_memories(path: str | Path) -> Iterator[DocumentMemory]:
    """Read and validate memories from JSONL; errors name the file and line."""
    path = Path(path)
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise MemoryValidationError(f"{where}: not UTF-8 (byte {exc.start}); memories files are UTF-8 JSONL "
                                            "written by memreader gen/read — regenerate or re-encode it") from None
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise MemoryValidationError(f"{where}: not valid JSON ({exc.msg}); the file may be truncated — "
                                            "delete the line and rerun the stage to regenerate it") from None
            yield DocumentMemory.from_dict(data, where=where)


def read_memories(path: str | Path) -> list[DocumentMemory]:
    """All memories of a JSONL file."""
    return list(iter_memories(path))
