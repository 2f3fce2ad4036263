"""The structure teacher: the memory that a document's known structure implies, written without any model.

    memreader gen --config configs/data_gen/structure.yaml                       # teacher: structure
    memreader gen --set teacher=structure --set input=artifacts/runs/mydocs/ingest/corpus.jsonl

Structure comes from the record's ``sections``, ``boundaries`` (+ ``titles``) or ingest ``headings``; the memory is
the path of ``memreader read``'s own grammar that hits the most section starts, titled by section, with an
extractive core and no reasoning path. Details: docs/TRAINING.md (A teacher that knows the answer: the structure
teacher).
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any

from memreader.core.corpus import Document
from memreader.core.errors import MemReaderError
from memreader.core.guidance import MemoryGrammars, count_tokens_for, plan_guided_windows
from memreader.core.language import detect_language
from memreader.core.memory_grammar import BoundaryGraph, GrammarPlan, past_space
from memreader.core.registry import resolve_model
from memreader.core.schema import DocumentMemory, Scenario
from memreader.core.structure import structural_breaks
from memreader.core.windowing import prompt_tokens_of
from memreader.data_gen.teacher_flow import NOT_RANKED, UnitResult, candidate_row
from memreader.data_gen.units import window_units

FIX = ("ingest the documents from a structured format (memreader ingest: Markdown, HTML, Word keep their "
       "headings), or give each corpus record 'sections' ([{title, text}] that concatenate to its text) or "
       "gold 'boundaries' (section start offsets) with 'titles'")


class StructureError(MemReaderError, ValueError):
    """A document whose structure is missing or does not fit its text (message: problem — fix)."""


def sections_of(doc: Document) -> list[tuple[int, str]]:
    """``(start, title)`` of every section of ``doc``, the first at 0, from its record (see module doc)."""
    meta, text, n = doc.meta, doc.text, len(doc.text)
    if meta.get("sections") is not None:
        sections = meta["sections"]
        if not isinstance(sections, list) or not sections or not all(
                isinstance(s, dict) and isinstance(s.get("text"), str) for s in sections):
            raise StructureError(f"document {doc.doc_id!r}: 'sections' must be a non-empty list of "
                                 "{title, text} objects", FIX)
        out, pos = [], 0
        for i, s in enumerate(sections):
            if text[pos:pos + len(s["text"])] != s["text"]:
                raise StructureError(
                    f"document {doc.doc_id!r}: sections do not tile the document: section {i} "
                    f"({str(s.get('title'))[:40]!r}) does not match the text at offset {pos}",
                    "give sections whose texts, concatenated in order, are exactly the document text "
                    "(separators belong to a section)")
            out.append((pos, str(s.get("title") or "").strip()))
            pos += len(s["text"])
        if pos != n:
            raise StructureError(f"document {doc.doc_id!r}: sections do not tile the document: they cover "
                                 f"{pos} of its {n} characters", "add the missing text to the last section")
        return [(p, t) for p, t in out if p < n]
    if meta.get("boundaries") is not None:
        bounds = meta["boundaries"]
        if not isinstance(bounds, list) or not all(isinstance(b, int) and not isinstance(b, bool) for b in bounds):
            raise StructureError(f"document {doc.doc_id!r}: 'boundaries' must be a list of character offsets", FIX)
        bad = [b for b in bounds if not 0 < b < n]
        if bad:
            raise StructureError(f"document {doc.doc_id!r}: boundaries {bad[:5]} are out of range (0, {n})",
                                 "give the offsets where sections 2..K start, each inside the text")
        if any(b >= c for b, c in zip(bounds, bounds[1:], strict=False)):
            raise StructureError(f"document {doc.doc_id!r}: boundaries are not strictly increasing: {bounds[:10]}",
                                 "sort the offsets and drop duplicates")
        titles = meta.get("titles")
        if titles is not None and (not isinstance(titles, list) or len(titles) != len(bounds) + 1):
            raise StructureError(f"document {doc.doc_id!r}: 'titles' needs one title per section "
                                 f"({len(bounds) + 1}), got {len(titles) if isinstance(titles, list) else titles!r}",
                                 "give len(boundaries) + 1 titles, or leave 'titles' out")
        starts = [0, *bounds]
        return [(s, str(titles[i]) if titles else _first_words(text[s:])) for i, s in enumerate(starts)]
    if meta.get("headings"):
        heads = [(int(h[0]), " > ".join(str(x) for x in h[1])) for h in meta["headings"] if 0 <= int(h[0]) < n]
        out = [(s, t) for s, t in heads]
        if not out or out[0][0] > 0:
            lead = str(meta.get("title") or meta.get("source") or doc.doc_id)
            out.insert(0, (0, lead))
        return out
    raise StructureError(f"document {doc.doc_id!r} has no structure (no 'sections', 'boundaries' or heading map)",
                         FIX)


def _first_words(text: str, words: int = 8) -> str:
    return " ".join(text.split()[:words])


_NOT_FREE = re.compile(r"[<\[\]\s]+")


def free_text(text: str) -> str:
    """``text`` as the memory grammar's free text allows it: one line, no ``<`` or ``[`` (``]`` too, for
    symmetry), not starting with a blank."""
    return _NOT_FREE.sub(" ", text).strip()


_SENTENCE = re.compile(r".+?(?:[.!?;][\"'”’)\]]*(?=\s|$)|[。！？；]+[”’」』）)]*|$)", re.S)


def lead_sentences(text: str, budget: int, count_tokens: Any) -> str:
    """The leading sentence(s) of ``text`` within ``budget`` tokens (the first one cut at a word or, for
    Chinese, a character when even it is longer)."""
    out = ""
    for m in _SENTENCE.finditer(text):
        cand = free_text(out + " " + m.group()) if out else free_text(m.group())
        if not cand or count_tokens(cand) > budget:
            break
        out = cand
    if out:
        return out
    first = free_text(text)
    cut = len(first)
    while cut > 1 and count_tokens(first[:cut]) > budget:
        cut = max(1, math.floor(cut * 0.85))
    piece = first[:cut]
    if " " in piece and cut < len(first):
        piece = piece.rsplit(" ", 1)[0]
    return piece.strip() or first[:1]


def snap(text: str, starts: list[int]) -> set[int]:
    """Section starts moved past leading whitespace (where a chunk that ends before them ends)."""
    return {past_space(text, s) for s in starts}


def best_path(graph: BoundaryGraph, starts: list[int]) -> list[int]:
    """Chunk ends along the grammar's path that hits the most section starts, then cuts least elsewhere
    (ties: the earliest end). A start counts as hit when only whitespace lies between it and the end."""
    n = len(graph.document)
    gold = snap(graph.document, starts)
    best: dict[int, tuple[int, int, list[int]]] = {n: (0, 0, [])}
    for s in reversed(graph.starts):
        options = []
        for e in graph.edges[s]:
            hits, cuts, path = best[e]
            hit = 1 if e in gold and e < n else 0
            options.append((hits + hit, cuts - (0 if hit or e == n else 1), [e, *path]))
        best[s] = max(options, key=lambda o: (o[0], o[1], [-x for x in o[2]]))
    return best[0][2]


def structure_memory(unit_id: str, text: str, sections: list[tuple[int, str]], plan: GrammarPlan,
                     count_tokens: Any) -> DocumentMemory:
    """The memory of ``text`` (one window or a whole document) that its ``sections`` imply (module doc)."""
    ends = best_path(plan.graph, [s for s, _ in sections if s > 0])
    starts = [0, *ends[:-1]]
    section_starts = [s for s, _ in sections]
    scenarios = []
    for s, e in zip(starts, ends, strict=True):
        i = max(j for j, st in enumerate(section_starts) if st <= max(s, section_starts[0]))
        title = free_text(sections[i][1]) or _first_words(free_text(text[s:e]))
        topic = lead_sentences(title, max(1, plan.topic_tokens - 2), count_tokens)
        core = lead_sentences(text[s:e], max(1, plan.core_tokens - 4), count_tokens)
        scenarios.append(Scenario(topic, core, s, e))
    mem = DocumentMemory(unit_id, text, scenarios)
    mem.validate()
    gold = snap(text, [s for s, _ in sections if s > 0])
    mem.meta["generation"] = {"guided": False, "teacher": "structure", "fate": "structure",
                              "grammar": plan.meta(), "sections": len(sections),
                              "section_starts_hit": sum(1 for e in ends[:-1] if e in gold)}
    return mem


class _Tokens:
    """What window and grammar planning need from a backend: the reader model's tokenizer and window."""

    def __init__(self, model: str) -> None:
        from transformers import AutoConfig, AutoTokenizer

        path = resolve_model(model)
        self._tok = AutoTokenizer.from_pretrained(path)
        self._window = getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", None)

    def tokenizer(self) -> Any:
        return self._tok

    def model_window(self) -> int | None:
        return self._window


def structure_results(cfg: Any, docs: list[Document]) -> tuple[list[UnitResult], dict[str, list[Any]],
                                                               list[dict[str, str]]]:
    """(one result per unit, each windowed document's windows, refused documents) for ``docs``: every
    document planned as the guided reader plans it (``cfg.model`` is the reader's model), then given the
    memory its structure implies. A document without structure is refused before anything is planned."""
    failures: list[dict[str, str]] = []
    sections: dict[str, list[tuple[int, str]]] = {}
    usable = []
    for doc in docs:
        try:
            sections[doc.doc_id] = sections_of(doc)
            usable.append(doc)
        except StructureError as exc:
            failures.append({"doc_id": doc.doc_id, "stage": "structure", "error": str(exc)})
    if not usable:
        first = failures[0]["error"] if failures else "no documents"
        raise StructureError(f"no document of the corpus has a usable structure (first: {first})", FIX)
    backend = _Tokens(cfg.model)
    count = count_tokens_for(backend)
    grammars = MemoryGrammars(cfg.grammar_settings(**cfg.marker()), count)
    prompt = cfg.reader_prompt()
    langs = sorted({detect_language(d.text) for d in usable})
    sizing = {"count_tokens": count, "settings": cfg.windows(), "max_new_tokens": cfg.max_new_tokens,
              "prompt_tokens": max(prompt_tokens_of(prompt.render(lang, "")[0], backend, count) for lang in langs),
              "model_window": backend.model_window(), "grammar": grammars.settings}
    texts = [d.text for d in usable]
    breaks = [structural_breaks(d.meta) for d in usable]
    wplan, plans, plan_errors = plan_guided_windows(texts, grammars, cfg.max_new_tokens,
                                                    breaks if any(breaks) else None, **sizing)
    refused = dict(wplan.errors)
    for j, error in plan_errors.items():
        refused.setdefault(wplan.flat()[j][0], error)
    units, windows = window_units(usable, wplan, plans, refused)
    results = []
    for unit in units:
        doc = unit.doc
        w = unit.window or windows[doc.doc_id][0]
        inside = [(max(0, s - w.start), t) for s, t in sections[doc.doc_id] if s < w.end]
        inside = [p for k, p in enumerate(inside) if k + 1 == len(inside) or inside[k + 1][0] > 0]
        res = UnitResult(unit)
        mem = structure_memory(unit.unit_id, unit.text, inside, unit.plan, count)
        mem.meta["source_sha256"] = doc.sha256
        res.memory, res.fates = mem, ["structure"]
        res.candidates.append(candidate_row(unit, mem, {**NOT_RANKED, "selected": True, "scores": None}))
        results.append(res)
    for d, error in sorted(refused.items()):
        failures.append({"doc_id": usable[d].doc_id, "stage": "guidance", "error": error})
    return results, windows, failures


def structure_config(cfg: Any) -> Any:
    """``cfg`` as the structure teacher runs it: no reasoning path, one candidate (nothing to choose from)."""
    return replace(cfg, reverse_com=False, num_candidates=1)
