"""One entry point for every chunking method: calibrate its size parameter, then chunk the corpus.

    memories, calibration = method_memories("sentence", {"d1": text, ...}, ChunkerSettings(), work_dir)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memreader.core.paths import write_json
from memreader.core.schema import DocumentMemory
from memreader.eval.chunkers.base import (
    METHODS,
    Calibration,
    ChunkerError,
    ChunkerSettings,
    check_documents,
    chunk_stats,
    chunks_as_memory,
    within,
)
from memreader.eval.chunkers.calibrate import SizeParam, search
from memreader.eval.chunkers.model_memories import (
    ReaderChunker,
    check_adapter,
    llm_param,
    teacher_memories,
)

log = logging.getLogger(__name__)

MODEL_METHODS = ("lumber", "llm-direct", "memreader")
"""Methods whose calibration runs a model per trial (they calibrate on ``calibration_docs``)."""

Chunk = Callable[[dict[str, str], float], list[DocumentMemory]]


def method_memories(method: str, documents: dict[str, str], settings: ChunkerSettings, work_dir: Path,
                    progress: bool = True) -> tuple[list[DocumentMemory], Calibration]:
    """Memories of every document by ``method`` (one of :data:`METHODS`), in the order of
    ``documents``, with the size parameter calibrated to ``settings.target_chars`` ±tolerance.

    Raises :class:`ChunkerError` for an unknown method, bad settings, an empty corpus or document,
    a missing adapter / teacher file, or a target no value of the size parameter reaches.
    """
    if method not in METHODS:
        raise ChunkerError(f"unknown chunking method {method!r}", f"use one of: {', '.join(METHODS)}")
    if settings.problems():
        raise ChunkerError("bad chunker settings: " + "; ".join(settings.problems()), "fix the values named")
    check_documents(documents)
    work_dir = Path(work_dir)
    if method == "teacher":
        return _teacher(documents, settings, work_dir)
    check_adapter(method, settings.adapter)  # before any model is loaded
    param, chunk, note = _method(method, documents, settings, work_dir, progress)
    calibrate_on = documents
    if method in MODEL_METHODS and 0 < settings.calibration_docs < len(documents):
        calibrate_on = dict(list(documents.items())[: settings.calibration_docs])
    trials = settings.model_max_trials if method in MODEL_METHODS else settings.max_trials
    found = search(param, lambda v: chunk(calibrate_on, v), method, settings.target_chars, settings.tolerance,
                   trials, progress)
    memories = found.memories if len(calibrate_on) == len(documents) else chunk(documents, found.value)
    stats = chunk_stats(memories)
    ok = within(stats.mean, settings.target_chars, settings.tolerance)
    notes = [n for n in (note(memories),) if n]
    if len(calibrate_on) < len(documents):
        notes.append(f"calibrated on the first {len(calibrate_on)} of {len(documents)} documents "
                     f"(mean {found.mean:.1f} there)")
        if not ok:
            notes.append(f"WARNING: over all documents the mean is {stats.mean:.1f}, outside ±"
                         f"{settings.tolerance:.0%} of {settings.target_chars}: raise calibration_docs")
            log.warning("%s: %s", method, notes[-1])
    def shown(v: float) -> Any:
        return int(v) if param.integer else round(v, 6)

    value = shown(found.value)
    cal = Calibration(method, param.name, value, settings.target_chars, settings.tolerance, round(stats.mean, 2),
                      round(stats.std, 2), stats.n_chunks, ok, [(shown(v), round(m, 2)) for v, m in found.tried],
                      "; ".join(notes), len(documents), len(calibrate_on))
    write_json(work_dir / method / "calibration.json", cal.to_dict())
    if progress:
        print(f"{method}: {param.name}={value} → mean {cal.mean_chars} ± {cal.std_chars} chars over "
              f"{cal.n_chunks} chunks of {cal.n_docs} documents (target {cal.target_chars} ±{cal.tolerance:.0%})")
    return memories, cal


def _method(method: str, documents: dict[str, str], settings: ChunkerSettings, work_dir: Path,
            progress: bool) -> tuple[SizeParam, Chunk, Callable[[list[DocumentMemory]], str]]:
    """The method's size parameter, its chunking function and a note about the run."""
    target, longest = settings.target_chars, max(len(t) for t in documents.values())
    if method in ("fixed", "sentence"):
        from memreader.eval.chunkers import rules

        spans = rules.fixed_spans if method == "fixed" else rules.sentence_spans_packed
        param = (rules.fixed_param if method == "fixed" else rules.sentence_param)(target, longest)
        return param, _span_chunker(method, param.name, lambda d, t, v: spans(t, v)), lambda _: ""
    if method == "semantic":
        from memreader.eval.chunkers.semantic import SemanticSplitter, semantic_param

        splitter = SemanticSplitter(settings.embedder, settings.device)
        param = semantic_param()
        chunk = _span_chunker(method, param.name, lambda d, t, v: splitter.spans(t, v, longest))
        return param, chunk, lambda _: f"embedders: {', '.join(splitter.used())}"
    if method == "lumber":
        from memreader.eval.chunkers.lumber import AnswerCache, LumberChunker, lumber_param

        client, backend, dtype = settings.chat("answer")
        own = work_dir / "lumber" / "answers.jsonl"  # a run that cached here before chunk_cache keeps its file
        cache = Path(settings.cache_dir) if settings.cache_dir and not own.is_file() else work_dir
        lumber = LumberChunker(client, AnswerCache(cache / "lumber" / "answers.jsonl", settings.lm, f"{backend}:{dtype}"),
                               settings.lumber_min_share, progress)
        param = lumber_param(target)

        def chunk(docs: dict[str, str], v: float) -> list[DocumentMemory]:
            spans = lumber.spans(docs, v)
            return [chunks_as_memory(d, t, spans[d], method, {param.name: int(v), "lm": settings.lm})
                    for d, t in docs.items()]

        return param, chunk, lambda _: (f"model {settings.lm}, guided; {lumber.calls} LM calls (rest cached); "
                                        f"{lumber.forced} windows with one allowed cut, made without a call")
    reader = ReaderChunker(method, settings, work_dir, progress)
    return llm_param(target), reader.memories, reader.note


def _span_chunker(method: str, name: str, spans: Callable[[str, str, float], list[tuple[int, int]]]) -> Chunk:
    def chunk(docs: dict[str, str], v: float) -> list[DocumentMemory]:
        value = v if name == "threshold" else int(v)
        return [chunks_as_memory(d, t, spans(d, t, v), method, {name: value}) for d, t in docs.items()]

    return chunk


def _teacher(documents: dict[str, str], settings: ChunkerSettings,
             work_dir: Path) -> tuple[list[DocumentMemory], Calibration]:
    memories = teacher_memories(documents, settings.teacher_memories)
    stats = chunk_stats(memories)
    ok = within(stats.mean, settings.target_chars, settings.tolerance)
    note = "not calibratable: the teacher's own chunk lengths"
    if not ok:
        note = (f"WARNING: the teacher's mean chunk length {stats.mean:.1f} is outside ±{settings.tolerance:.0%} of "
                f"{settings.target_chars} characters, so it is not length-matched with the other methods; " + note)
        log.warning("teacher: %s", note)
    cal = Calibration("teacher", "", None, settings.target_chars, settings.tolerance, round(stats.mean, 2),
                      round(stats.std, 2), stats.n_chunks, ok, [], note, len(documents), 0)
    write_json(work_dir / "teacher" / "calibration.json", cal.to_dict())
    return memories, cal
