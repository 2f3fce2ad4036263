"""Documents with gold segment boundaries: the loader, and scoring a memories file against them.

    from memreader.eval.gold_segments import load_gold_segments, score_memories
    gold = load_gold_segments("tests/eval/assets/gold_segments_small.jsonl")
    result = score_memories(gold, "artifacts/runs/demo/read/memories.jsonl")   # memreader.eval.segmentation scores

One JSON object per line (``id``, ``text``, ``boundaries``, optional ``titles``, ``lang``, ``source``, ``sections``);
bad input raises :class:`~memreader.eval.datasets.DatasetError` naming file, line, field and fix.
Details (the format and its checks): docs/EVALUATION.md (Segmentation against gold boundaries).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

from memreader.core.errors import MemReaderError
from memreader.core.schema import DocumentMemory, read_memories
from memreader.eval.datasets import DatasetError, JsonItem, iter_jsonl
from memreader.eval.segmentation import SegmentationScores, SegmentationSettings, aggregate, score_document

LANGS = ("en", "zh")


class GoldMismatchError(MemReaderError, ValueError):
    """Memories do not fit the gold documents (a text differs, or documents are missing)."""


@dataclass(frozen=True)
class GoldDocument:
    """One document with its gold segmentation."""

    id: str
    text: str
    boundaries: tuple[int, ...]
    titles: tuple[str, ...] | None = None
    lang: str | None = None
    source: str | None = None
    line: int = 0  # where it was read, for messages

    @property
    def segments(self) -> list[tuple[int, int]]:
        """The gold ``[start, end)`` spans, tiling the text."""
        cuts = [0, *self.boundaries, len(self.text)]
        return list(zip(cuts, cuts[1:], strict=False))


def _boundaries(item: JsonItem, n: int) -> tuple[int, ...]:
    values = item.require_type("boundaries", list)
    for i, b in enumerate(values):
        if isinstance(b, bool) or not isinstance(b, int):
            raise item.error("boundaries", f"item {i} is {type(b).__name__} {b!r:.40}, not an integer character "
                             "offset; write offsets as JSON integers")
        if not 0 < b < n:
            raise item.error("boundaries", f"item {i} = {b} is out of range: each boundary is where a segment "
                             f"starts, 0 < b < len(text) = {n}; drop it (0 and len(text) are implied) or fix it")
    for i in range(1, len(values)):
        if values[i] == values[i - 1]:
            raise item.error("boundaries", f"{values[i]} occurs twice (items {i - 1} and {i}); list each once")
        if values[i] < values[i - 1]:
            raise item.error("boundaries", f"not sorted: item {i} = {values[i]} follows {values[i - 1]}; "
                             "sort them in increasing order")
    return tuple(values)


def _titles(item: JsonItem, n_segments: int) -> tuple[str, ...] | None:
    if "titles" not in item.record or item.record["titles"] is None:
        return None
    titles = item.require_type("titles", list)
    bad = [t for t in titles if not isinstance(t, str)]
    if bad:
        raise item.error("titles", f"expected strings, found {type(bad[0]).__name__} {bad[0]!r:.40}")
    if len(titles) != n_segments:
        raise item.error("titles", f"{len(titles)} titles for {n_segments} segments (len(boundaries) + 1); give "
                         "one title per segment, or leave titles out")
    return tuple(titles)


def _first_difference(a: str, b: str) -> int:
    """The first offset where ``a`` and ``b`` differ (the shorter one's length when one is a prefix of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _check_sections(item: JsonItem, text: str, boundaries: tuple[int, ...],
                    titles: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """Check ``sections`` against text, boundaries and titles; their titles when ``titles`` is absent."""
    raw = item.require_type("sections", list)
    parts = [item.child(s, f"sections[{i}]") for i, s in enumerate(raw)]
    texts, heads = [p.str("text") for p in parts], [p.str("title") for p in parts]
    joined = "".join(texts)
    if joined != text:
        at = _first_difference(joined, text)
        raise item.error("sections", f"the section texts joined ({len(joined)} chars) differ from text ({len(text)} "
                         f"chars) from offset {at}: {joined[at:at + 30]!r} vs {text[at:at + 30]!r}; they must "
                         "concatenate to text exactly (keep the separators inside the sections)")
    starts = list(accumulate(len(t) for t in texts[:-1]))
    if tuple(starts) != boundaries:
        raise item.error("sections", f"sections start at {starts[:10]}, boundaries are {list(boundaries)[:10]}; "
                         "they must agree (no empty section; a boundary where each section after the first starts)")
    if titles is not None and tuple(heads) != titles:
        raise item.error("sections", "section titles differ from titles; make them the same or leave titles out")
    return titles if titles is not None else tuple(heads)


def load_gold_segments(path: str | Path, limit: int = 0) -> list[GoldDocument]:
    """Gold-boundary documents of a JSONL file (the first ``limit`` when > 0), checked; see the module doc."""
    out: list[GoldDocument] = []
    lines: dict[str, int] = {}
    for item in iter_jsonl(path):
        doc_id = str(item.id("id"))
        if doc_id in lines:
            raise item.error("id", f"duplicate id {doc_id!r} (first on line {lines[doc_id]}); ids must be unique")
        lines[doc_id] = item.line
        text = item.str("text")
        if not text:
            raise item.error("text", "is empty; drop the record or give its text")
        boundaries = _boundaries(item, len(text))
        titles = _titles(item, len(boundaries) + 1)
        if item.record.get("sections") is not None:
            titles = _check_sections(item, text, boundaries, titles)
        lang = item.record.get("lang")
        if lang is not None and lang not in LANGS:
            raise item.error("lang", f"{lang!r} is not one of {', '.join(LANGS)}; fix it or leave it out")
        source = item.record.get("source")
        if source is not None and not isinstance(source, str):
            raise item.error("source", f"expected a string, got {type(source).__name__}")
        out.append(GoldDocument(doc_id, text, boundaries, titles, lang, source, item.line))
        if limit and len(out) == limit:
            break
    if not out:
        raise DatasetError(path, "no gold documents in the file; each line needs id, text and boundaries")
    return out


def score_memories(gold: Sequence[GoldDocument], memories: str | Path | Sequence[DocumentMemory],
                   settings: SegmentationSettings | None = None, allow_missing: bool = False) -> SegmentationScores:
    """Score memories (a JSONL path or a list) against ``gold``, matched by ``doc_id``.

    A memory's document must equal its gold text exactly. Gold documents without a memory stop the
    scoring unless ``allow_missing``; then they are listed in the result's ``missing``. Memories of
    documents not in ``gold`` are ignored.
    """
    settings = settings or SegmentationSettings()
    where = str(memories) if isinstance(memories, (str, Path)) else "the memories"
    mems = read_memories(memories) if isinstance(memories, (str, Path)) else list(memories)
    by_id: dict[str, DocumentMemory] = {}
    for m in mems:
        if m.doc_id in by_id:
            raise GoldMismatchError(f"{where}: two memories of document {m.doc_id!r}; keep one per document")
        by_id[m.doc_id] = m
    missing = [g.id for g in gold if g.id not in by_id]
    if missing and not allow_missing:
        raise GoldMismatchError(
            f"{where}: {len(missing)} of {len(gold)} gold documents have no memory ({', '.join(missing[:5])}"
            f"{', ...' if len(missing) > 5 else ''}); read every gold document, or allow missing documents "
            "(allow_missing=true / --allow-missing) to score the others and report these as missing")
    docs = []
    for g in gold:
        m = by_id.get(g.id)
        if m is None:
            continue
        if m.document != g.text:
            at = _first_difference(m.document, g.text)
            raise GoldMismatchError(
                f"{where}: the memory of {g.id!r} has another text than the gold document (line {g.line}): "
                f"{len(m.document)} vs {len(g.text)} characters, first difference at offset {at} "
                f"({m.document[at:at + 30]!r} vs {g.text[at:at + 30]!r}); make the memories from the gold file's "
                "texts exactly (no cleaning or trimming), or offsets cannot be compared")
        docs.append(score_document(m, g.boundaries, g.titles, settings))
    if not docs:
        raise GoldMismatchError(f"{where}: no memory matches a gold document id; check that doc_id is the gold id")
    return aggregate(docs, settings, missing)
