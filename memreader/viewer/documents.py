"""What the memories viewer shows, read from the files a run wrote: memories, candidates, gold boundaries.

A memories file is read leniently on purpose: a memory whose spans do not tile its document is still shown, with
the gap or overlap marked and the problem named (the viewer is where such a memory gets looked at), while a file
that is not memories at all is refused with what was found and what was expected. Each document becomes one
compact JSON object for the page's script (:func:`view_document`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memreader.core.errors import MemReaderError
from memreader.core.schema import DocumentMemory, Scenario, tiling_problems
from memreader.core.structure import describe_where, where

_EXPECTED = ("a memories JSONL written by `memreader gen` or `memreader read`: one JSON object per line with "
             "doc_id, document and scenarios (each with outline, core, start, end)")
_GENERATION_KEYS = ("guided", "finish_reason", "fate", "prompt_tokens", "completion_tokens", "windows")
_META_KEYS = ("model", "adapter", "prompt", "backend", "dtype", "truncated", "fallback")
_CANDIDATE_KEYS = ("candidate", "clarity", "completeness", "rank_clarity", "rank_completeness", "rrf", "selected",
                   "fate", "excluded", "outline")


class ViewerInputError(MemReaderError, ValueError):
    """A file the viewer cannot show; the message names the file, the line and what was expected."""


def _hint(data: dict[str, Any]) -> str:
    """What a wrong JSONL most likely is, from its keys."""
    if "candidate" in data and "spans" in data:
        return "this looks like a candidates file: pass it with --candidates beside its memories file"
    if "boundaries" in data and "text" in data:
        return "this looks like a gold-boundary data set: pass it with --gold beside a memories file"
    if "text" in data and "id" in data:
        return "this looks like a corpus: turn it into memories first (memreader read --set input=FILE)"
    if "question" in data:
        return "this looks like QA data or answers: view an evaluation with `memreader report RUN` (report.html)"
    return "give the memories.jsonl of a run (runs/<run>/read/ or runs/<run>/gen/)"


def _lines(path: Path, what: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of a JSONL file; anything else raises :class:`ViewerInputError`."""
    if not path.is_file():
        raise ViewerInputError(f"{path}: no such file", f"give the path of {what}")
    with path.open("rb") as fh:
        for n, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ViewerInputError(f"{path}:{n} is not UTF-8 text", f"expected {what}") from None
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ViewerInputError(f"{path}:{n} is not valid JSON ({exc.msg})", f"expected {what}") from None
            if not isinstance(data, dict):
                raise ViewerInputError(f"{path}:{n} holds a JSON {type(data).__name__}, not an object",
                                       f"expected {what}")
            yield n, data


def _memory(path: Path, n: int, data: dict[str, Any]) -> DocumentMemory:
    """The memory of one line, not validated (spans that do not tile are shown, not refused)."""
    missing = [k for k in ("doc_id", "document", "scenarios") if k not in data]
    if missing:
        raise ViewerInputError(f"{path}:{n} is not a memory: it lacks {', '.join(missing)} (keys: "
                               f"{', '.join(sorted(data)[:8])})", f"expected {_EXPECTED}; {_hint(data)}")
    if not isinstance(data["document"], str) or not isinstance(data["scenarios"], list):
        raise ViewerInputError(f"{path}:{n}: document must be a string and scenarios a list", f"expected {_EXPECTED}")
    scenarios = []
    for i, s in enumerate(data["scenarios"]):
        try:
            scenarios.append(Scenario(str(s.get("outline", "")), str(s.get("core", "")), int(s["start"]),
                                      int(s["end"])))
        except (AttributeError, KeyError, TypeError, ValueError):
            raise ViewerInputError(f"{path}:{n}: scenario {i} has no integer start and end ({str(s)[:80]})",
                                   f"expected {_EXPECTED}") from None
    return DocumentMemory(str(data["doc_id"]), data["document"], scenarios, data.get("reasoning"),
                          dict(data.get("meta") or {}))


def read_memories_leniently(path: str | Path) -> Iterator[DocumentMemory]:
    """Every memory of a memories JSONL, spans as written (tiling is checked by :func:`view_document`)."""
    path, n = Path(path), 0
    for n, data in _lines(path, _EXPECTED):
        yield _memory(path, n, data)
    if not n:
        raise ViewerInputError(f"{path} holds no memories (empty file)", f"expected {_EXPECTED}")


@dataclass
class Attachments:
    """What is drawn beside the memories: candidates by document and gold segmentations by document id."""

    candidates: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    gold: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    """Loud remarks for the page and the console (rows naming documents the memories file lacks...)."""


def read_candidates(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """``memreader gen``'s candidates.jsonl grouped by document, each row with its unit (window) id."""
    path = Path(path)
    what = "a candidates.jsonl written by `memreader gen` (one row per candidate with doc_id, candidate and spans)"
    out: dict[str, list[dict[str, Any]]] = {}
    for n, row in _lines(path, what):
        if not {"doc_id", "candidate", "spans"} <= set(row):
            raise ViewerInputError(f"{path}:{n} is not a candidate row (keys: {', '.join(sorted(row)[:8])})",
                                   f"expected {what}")
        try:
            row["spans"] = [[int(a), int(b)] for a, b in row["spans"]]
        except (TypeError, ValueError):
            raise ViewerInputError(f"{path}:{n}: spans must be [start, end] integer pairs, got {str(row['spans'])[:80]}",
                                   f"expected {what}") from None
        out.setdefault(str(row["doc_id"]), []).append(row)
    return out


def read_gold(path: str | Path) -> dict[str, dict[str, Any]]:
    """A gold-boundary data set (:mod:`memreader.eval.gold_segments`' format) by document id."""
    path = Path(path)
    what = 'a gold-boundary JSONL: {"id": ..., "text": ..., "boundaries": [offsets], "titles": [...]} per line'
    out = {}
    for n, row in _lines(path, what):
        if not {"id", "text", "boundaries"} <= set(row) or not isinstance(row["boundaries"], list) or \
                not all(isinstance(b, int) for b in row["boundaries"]):
            raise ViewerInputError(f"{path}:{n} is not a gold document with integer boundaries (keys: "
                                   f"{', '.join(sorted(row)[:8])})", f"expected {what}")
        out[str(row["id"])] = {"text": row["text"], "boundaries": row["boundaries"], "titles": row.get("titles")}
    return out


def _candidates_of(mem: DocumentMemory, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The page's form of a document's candidate rows: spans moved into document offsets, scores kept."""
    # unit id -> where its window starts in the document (a windowed memory's candidates tile their window)
    offsets = {f"{mem.doc_id}#w{w['index']}": int(w["start"]) for w in mem.meta.get("windows") or []
               if isinstance(w, dict) and "index" in w and "start" in w}
    out = []
    for row in rows:
        unit = str(row.get("unit_id") or mem.doc_id)
        shift = offsets.get(unit, 0)
        cand = {k: row[k] for k in _CANDIDATE_KEYS if row.get(k) is not None}
        cand["unit"] = unit
        cand["spans"] = [[s + shift, e + shift] for s, e in row["spans"]]
        scores = row.get("scores") or {}
        if scores.get("boundaries"):
            cand["boundary_scores"] = [round(float(b), 4) for b in scores["boundaries"]]
        out.append(cand)
    return sorted(out, key=lambda c: (c["unit"], c.get("candidate", 0)))


def view_document(mem: DocumentMemory, attach: Attachments | None = None) -> dict[str, Any]:
    """One document as the page's script reads it (short keys: a 10,000-document page stays small)."""
    spans = [(s.start, s.end) for s in mem.scenarios]
    doc: dict[str, Any] = {"id": mem.doc_id, "text": mem.document,
                           "sc": [[s.start, s.end, s.outline, s.core] for s in mem.scenarios]}
    problems = tiling_problems(spans, len(mem.document))
    if problems:
        doc["problems"] = problems
    structure = mem.meta.get("structure")
    if structure is not None and (not isinstance(structure, list) or len(structure) != len(mem.scenarios)):
        doc.setdefault("problems", []).append(f"meta.structure has {len(structure) if isinstance(structure, list) else 'no list of'} "
                                              f"entries for {len(mem.scenarios)} scenarios: pages and headings not shown")
    elif structure or mem.meta.get("source"):
        doc["where"] = [describe_where(where(mem, i)) for i in range(len(mem.scenarios))]
    generation = mem.meta.get("generation") or {}
    record = {k: generation[k] for k in _GENERATION_KEYS if generation.get(k) is not None}
    record.update({k: mem.meta[k] for k in _META_KEYS if mem.meta.get(k) not in (None, "")})
    if mem.meta.get("selection"):
        sel = mem.meta["selection"]
        record["selection"] = (f"{sel.get('usable')} usable of {sel.get('candidates')} candidates; rrf "
                               f"{sel.get('rrf')}")
    if mem.meta.get("alignment"):
        align = mem.meta["alignment"]
        record["alignment"] = ", ".join(f"{k} {align[k]}" for k in ("chunks", "merged", "gap_chars", "coverage_exact")
                                        if k in align)
    if record:
        doc["gen"] = record
    if mem.reasoning:
        doc["reasoning"] = mem.reasoning
    cuts = mem.meta.get("cuts")
    if isinstance(cuts, dict) and isinstance(cuts.get("ends"), list) and isinstance(cuts.get("p"), list) \
            and len(cuts["ends"]) == len(cuts["p"]):
        doc["cuts"] = {k: cuts.get(k) for k in ("ends", "p", "threshold", "breaks", "head")}
    if attach is not None:
        if mem.doc_id in attach.candidates:
            doc["cand"] = _candidates_of(mem, attach.candidates[mem.doc_id])
        gold = attach.gold.get(mem.doc_id)
        if gold is not None:
            if gold["text"] != mem.document:
                doc["gold_note"] = (f"the gold text of {mem.doc_id!r} differs from the memory's document "
                                    f"({len(gold['text'])} vs {len(mem.document)} characters): gold not drawn")
            else:
                doc["gold"] = {"boundaries": gold["boundaries"], "titles": gold["titles"]}
    return doc
