"""What the teacher reads at once: whole documents, or windows of long ones, and their merge.

A document longer than the teacher's window (``window_tokens``; 0 = sized to the model, no limit
for an HTTP endpoint whose window is unknown) or, guided, than one memory grammar takes, is cut
into overlapping windows (:mod:`memreader.core.windowing`). Each window is a *unit*: its own outline,
candidates, scores, selection, CoM and SFT record (the student reads the same windows). The
winners of a document's windows are merged into one memory that tiles the whole document, with
the window mapping in ``meta["windows"]``; the document fails if any of its windows did.
"""

from __future__ import annotations

import logging
from typing import Any

from memreader.core.corpus import Document
from memreader.core.guidance import MemoryGrammars, count_tokens_for, plan_guided_windows, wants_grammar
from memreader.core.language import detect_language
from memreader.core.prompts import render
from memreader.core.schema import DocumentMemory
from memreader.core.windowing import merge_window_memories, model_window_of, prompt_tokens_of
from memreader.data_gen.teacher_flow import Unit, UnitResult

log = logging.getLogger(__name__)


def _prompt_room(cfg: Any, backend: Any, count: Any, langs: list[str]) -> tuple[int, int]:
    """(prompt tokens around an empty document, reply budget) of the teacher's largest request: the
    extraction prompt carries the outline, the CoM prompt carries the memory."""
    worst = 0
    for lang in langs:
        extraction = prompt_tokens_of(render("teacher_extraction", lang, document="", outline="")[0], backend, count)
        com = prompt_tokens_of(render("reverse_com", lang, document="", memory="")[0], backend, count)
        outline = prompt_tokens_of(render("teacher_outline", lang, document="", min_parts=cfg.min_parts,
                                          max_parts=cfg.max_parts)[0], backend, count)
        # each request as "prompt + document + max_new_tokens": the outline reply is shorter, the
        # extraction prompt holds the outline, the CoM prompt holds the memory and adds its own reply
        worst = max(worst, outline + cfg.outline_max_new_tokens - cfg.max_new_tokens,
                    extraction + cfg.outline_max_new_tokens, com + cfg.com_max_new_tokens)
    return worst, cfg.max_new_tokens


def make_units(cfg: Any, docs: list[Document], backend: Any) -> tuple[list[Unit], dict[str, list[Any]],
                                                                      list[dict[str, str]]]:
    """Units for every document (windows of long ones), each window's grammar, and the documents
    refused before any call (no window fits, no grammar possible: each message names the fix)."""
    count = count_tokens_for(backend)
    grammars = MemoryGrammars(cfg.grammar_settings(**cfg.marker()), count, may_go_unguided=cfg.teacher == "openai"
                              and cfg.guided == "auto") if wants_grammar(cfg.guided, cfg.teacher) else None
    texts = [d.text for d in docs]
    prompt_tokens, budget = _prompt_room(cfg, backend, count, sorted({detect_language(t) for t in texts}))
    wplan, plans, plan_errors = plan_guided_windows(
        texts, grammars, cfg.max_new_tokens, count_tokens=count, settings=cfg.windows(), prompt_tokens=prompt_tokens,
        max_new_tokens=budget, model_window=model_window_of(backend), grammar=grammars.settings if grammars else None)
    flat = wplan.flat()
    refused = dict(wplan.errors)
    for j, error in plan_errors.items():
        d, w = flat[j]
        refused.setdefault(d, error if len(wplan.windows[d]) == 1 else f"window {w.index} [{w.start}, {w.end}): {error}")
    failures = []
    for d, error in sorted(refused.items()):
        failures.append({"doc_id": docs[d].doc_id, "stage": "guidance", "error": error})
        log.warning("doc %s: no memory possible (%s)", docs[d].doc_id, error)
    return (*window_units(docs, wplan, plans, refused), failures)


def window_units(docs: list[Document], wplan: Any, plans: list[Any], refused: dict[int, str]
                 ) -> tuple[list[Unit], dict[str, list[Any]]]:
    """A unit per window of every document not ``refused`` (``<doc_id>#w<index>`` when it has several windows;
    ``plans``: each window's grammar plan), and each of those documents' windows."""
    units, windows = [], {}
    for (d, w), text, plan in zip(wplan.flat(), wplan.texts([d.text for d in docs]), plans, strict=True):
        if d in refused:
            continue
        doc = docs[d]
        single = len(wplan.windows[d]) == 1
        windows[doc.doc_id] = wplan.windows[d]
        units.append(Unit(doc, doc.doc_id if single else f"{doc.doc_id}#w{w.index}", text, detect_language(text),
                          plan, None if single else w))
    return units, windows


def merge_units(results: list[UnitResult], windows: dict[str, list[Any]], overlap_tokens: int
                ) -> tuple[list[DocumentMemory], list[DocumentMemory], list[dict[str, str]]]:
    """(one memory per document, the units' own memories for SFT, documents lost to a failed window)."""
    by_doc: dict[str, list[UnitResult]] = {}
    for res in results:
        by_doc.setdefault(res.unit.doc.doc_id, []).append(res)
    documents, unit_memories, failures = [], [], []
    for doc_id, parts in by_doc.items():
        mems = [p.memory for p in parts]
        if len(parts) == 1:
            if mems[0] is not None:
                documents.append(mems[0])
                unit_memories.append(mems[0])
            continue
        missing = [p.unit.unit_id for p in parts if p.memory is None]
        if missing:
            failures.append({"doc_id": doc_id, "stage": "windows",
                             "error": f"{len(missing)} of {len(parts)} windows have no memory ({missing[:3]}); the "
                                      "document is not written, the windows that worked are cached"})
            continue
        unit_memories += mems  # type: ignore[arg-type]
        doc = parts[0].unit.doc
        merged = merge_window_memories(doc_id, doc.text, windows[doc_id], mems,  # type: ignore[arg-type]
                                       {"source_sha256": doc.sha256, "windowing": {"overlap_tokens": overlap_tokens}})
        documents.append(merged)
    return documents, unit_memories, failures
