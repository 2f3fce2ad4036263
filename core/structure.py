"""Where each scenario of a memory sits in its source file: pages and heading path, from the corpus record.

    annotate(memory, doc.meta)          # after reading: memory.meta["source"] and memory.meta["structure"]
    where(memory, 2)                    # {"source": "reports/q1.pdf", "pages": [3, 4], "headings": ["Q1", "Sales"]}

``memreader ingest`` writes a page map (``pages``: ``[offset, page]`` where each page's text starts) and a
heading map (``headings``: ``[offset, heading path]``) into each corpus record. A memory tiles its document, so
each scenario's ``[start, end)`` finds the pages it spans and the heading path in force at its start by
bisection. Records without maps (a plain JSONL corpus) leave the memory as it was.
"""

from __future__ import annotations

import bisect
import json
import logging
from pathlib import Path
from typing import Any

from memreader.core.paths import sha256_file
from memreader.core.schema import DocumentMemory

log = logging.getLogger(__name__)

__all__ = ["annotate", "changed_sources", "structural_breaks", "describe_where", "headings_at", "page_at", "where", "where_from_json"]


def _index(starts: list[int], offset: int) -> int:
    return bisect.bisect_right(starts, offset) - 1


def page_at(pages: list[Any], offset: int) -> int | None:
    """The page holding character ``offset`` of a page map (None before the first page's text)."""
    i = _index([p[0] for p in pages], offset)
    return pages[i][1] if i >= 0 else None


def headings_at(headings: list[Any], offset: int) -> list[str]:
    """The heading path in force at character ``offset`` of a heading map ([] before the first heading)."""
    i = _index([h[0] for h in headings], offset)
    return list(headings[i][1]) if i >= 0 else []


def structural_breaks(doc_meta: dict[str, Any]) -> list[int]:
    """Offsets where a heading or a page starts in a corpus record (``[]`` without maps): preferred chunk ends."""
    marks = [h[0] for h in doc_meta.get("headings") or []] + [p[0] for p in doc_meta.get("pages") or []]
    return sorted({int(m) for m in marks if int(m) > 0})


def annotate(memory: DocumentMemory, doc_meta: dict[str, Any]) -> DocumentMemory:
    """Add ``source`` (file, format, sha256) and per-scenario ``structure`` (pages, headings) to the memory's meta
    when the corpus record has a page or heading map; returns the memory."""
    pages, headings = doc_meta.get("pages"), doc_meta.get("headings")
    if "source" in doc_meta:
        memory.meta["source"] = {k: doc_meta[k] for k in ("source", "format", "sha256") if k in doc_meta}
    if not pages and not headings:
        return memory
    page_starts = [p[0] for p in pages or []]
    structure = []
    for sc in memory.scenarios:
        entry: dict[str, Any] = {}
        if pages:
            first, last = _index(page_starts, sc.start), _index(page_starts, max(sc.start, sc.end - 1))
            entry["pages"] = sorted({pages[i][1] for i in range(max(first, 0), last + 1)}) if last >= 0 else []
        if headings:
            entry["headings"] = headings_at(headings, sc.start)
        structure.append(entry)
    memory.meta["structure"] = structure
    return memory


def where(memory: DocumentMemory, scenario: int) -> dict[str, Any]:
    """The source file, pages and heading path of one scenario (empty values when unknown)."""
    entry = (memory.meta.get("structure") or [{}] * len(memory.scenarios))[scenario]
    return {"source": memory.meta.get("source", {}).get("source"), "pages": entry.get("pages", []),
            "headings": entry.get("headings", [])}


def where_from_json(text: str) -> dict[str, Any]:
    """A stored ``where`` record (an index row's ``origin``) back as a dict; ``{}`` for "". A record that does
    not parse (or is not an object) is logged as a warning naming it and the fix, and gives ``{}``: where a chunk
    came from is shown when known, never in the way of the chunk itself."""
    if not text:
        return {}
    try:
        found = json.loads(text)
    except json.JSONDecodeError as exc:
        problem = f"is not valid JSON ({exc})"
    else:
        if isinstance(found, dict):
            return found
        problem = f"is a JSON {type(found).__name__}, not an object"
    log.warning("a stored chunk origin %s: %r; its source, pages and headings are not shown. Fix: rebuild the "
                "index from the memories (memreader index --set replace=true)", problem, text[:120])
    return {}


def describe_where(found: dict[str, Any]) -> str:
    """``reports/q1.pdf p. 3-4 · Q1 > Sales``: the source, pages and heading path, for people ("" when unknown)."""
    parts = []
    if found.get("source"):
        parts.append(str(found["source"]))
    pages = found.get("pages") or []
    if pages:
        parts.append(f"p. {pages[0]}" if len(pages) == 1 else f"p. {pages[0]}-{pages[-1]}")
    text = " ".join(parts)
    if found.get("headings"):
        text += (" · " if text else "") + " > ".join(found["headings"])
    return text


def changed_sources(memories: list[DocumentMemory]) -> tuple[list[str], list[str]]:
    """``(changed, missing)``: the source files of ``memories`` (from ``memreader ingest``) whose content is no
    longer what was ingested, and those that are gone. Each file is hashed once."""
    changed, missing, seen = [], [], set()
    for mem in memories:
        src = mem.meta.get("source") or {}
        path, digest = src.get("source"), src.get("sha256")
        if not path or not digest or path in seen:
            continue
        seen.add(path)
        if not Path(path).is_file():
            missing.append(path)
        elif sha256_file(Path(path)) != digest:
            changed.append(path)
    return changed, missing
