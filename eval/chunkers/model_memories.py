"""Memories written by models: LLM-direct, MemReader, and the teacher's memories from ``memreader gen``.

``llm-direct`` and ``memreader`` run the guided reader (:mod:`memreader.inference.reader`) without and with the LoRA
adapter; ``chunk_chars`` sets the memory grammar's chunk-length window and each value reads into its own resumable
run folder under the chunk cache. ``teacher`` reads ``memreader gen``'s memories file; its mean is only reported.
Details: docs/CHUNKERS.md (LLM-direct and MemReader).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from memreader.core.paths import write_jsonl
from memreader.core.schema import DocumentMemory, MemoryValidationError, read_memories
from memreader.eval.chunkers.base import ChunkerError, ChunkerSettings
from memreader.eval.chunkers.calibrate import SizeParam

log = logging.getLogger(__name__)


def llm_param(target: int) -> SizeParam:
    """The centre of the guided chunk-length window, in characters."""
    return SizeParam("chunk_chars", lo=8, hi=20 * target, start=target)


def check_adapter(method: str, adapter: str) -> None:
    """memreader needs a LoRA adapter folder; llm-direct must not get one."""
    if method == "memreader":
        if not adapter:
            raise ChunkerError("memreader needs the LoRA adapter: settings.adapter is empty",
                               "set adapter=<folder written by `memreader train`> (llm-direct is the same model "
                               "without it)")
        if not (Path(adapter) / "adapter_config.json").is_file():
            raise ChunkerError(f"adapter={adapter!r} is not a LoRA adapter folder (no adapter_config.json)",
                               "pass the adapter folder written by `memreader train`")


class ReaderChunker:
    """Reads documents with the MemReader prompt, guided, at a given ``chunk_chars``."""

    def __init__(self, method: str, settings: ChunkerSettings, work_dir: Path, progress: bool = False) -> None:
        check_adapter(method, settings.adapter)
        self.method, self.settings, self.progress = method, settings, progress
        self.adapter = settings.adapter if method == "memreader" else ""
        # the reads are content-addressed (read_key, and each document's source hash), so runs can share them; a run
        # that already read into its own folder (before chunk_cache) keeps that folder
        self.own = Path(work_dir) / method  # this run's corpus file
        self.folder = self.own
        if settings.cache_dir:
            if any(self.own.glob("c*-*/read/memories.jsonl")):
                print(f"{method}: this run's own reads in {self.own} are kept in use (they predate chunk_cache)")
            else:
                self.folder = Path(settings.cache_dir) / method
        self._backend: Any = None
        self.engine: Any = None  # (backend, dtype) once the chat is loaded
        self.summaries: list[dict[str, Any]] = []

    def backend(self) -> Any:
        """The chat (transformers or vLLM, ``settings.backend``), loaded once and shared by every value tried."""
        if self._backend is None:
            self._backend, *self.engine = self.settings.chat("read", self.adapter)
        return self._backend

    def config(self, chunk_chars: float, corpus: Path) -> Any:
        from memreader.inference.reader import ReadConfig

        s = self.settings
        lo = max(1, round(chunk_chars * (1 - s.llm_spread)))
        self.backend()
        backend, dtype = self.engine
        return ReadConfig(input=str(corpus), model=s.lm, adapter=self.adapter, batch_size=s.batch_size,
                          backend=backend, dtype=dtype, max_model_len=8192, max_new_tokens=s.max_new_tokens, guided="on", min_chunk_chars=lo,
                          max_chunk_chars=max(lo, round(chunk_chars * (1 + s.llm_spread))), cjk_char_weight=1.0,
                          max_scenarios=s.max_scenarios, run=f"{self.method}-chunker")

    def memories(self, documents: dict[str, str], chunk_chars: float) -> list[DocumentMemory]:
        """Guided memories of ``documents`` (read or resumed), in the order given."""
        from memreader.core.corpus import read_corpus
        from memreader.core.runlock import RunLock, RunLocked
        from memreader.inference.reader import read_documents, read_key

        corpus = self.own / f"corpus-{len(documents)}.jsonl"
        write_jsonl(corpus, [{"id": d, "text": t} for d, t in documents.items()])
        cfg = self.config(chunk_chars, corpus)
        if cfg.problems():
            raise ChunkerError(f"{self.method}: reader settings at chunk_chars={int(chunk_chars)} are invalid: "
                               + "; ".join(cfg.problems()), "fix the chunker settings named")
        out_dir = self.folder / f"c{int(chunk_chars)}-{read_key(cfg)}" / "read"
        try:
            with RunLock(out_dir):
                summary = read_documents(cfg, read_corpus(cfg.input), out_dir, self.backend())
        except RunLocked as exc:
            if self.folder == self.own:
                raise
            raise ChunkerError(f"{self.method}: {exc.problem}", "another evaluation is reading these documents with "
                               "the same settings into the shared chunk cache: wait for it (its reads are then reused), "
                               "or give this run its own folder with --set chunk_cache=run") from None
        self.summaries.append(summary)
        got = {m.doc_id: m for m in read_memories(out_dir / "memories.jsonl")}
        missing = [d for d in documents if d not in got]
        if missing:
            why = "; ".join(f"{d}: {e}" for d, e in list(summary["failed"].items())[:3])
            raise ChunkerError(
                f"{self.method}: {len(missing)} document(s) got no memory at chunk_chars={int(chunk_chars)}: "
                f"{missing[:5]}" + (f" ({why})" if why else " (replies cut off by max_new_tokens)"),
                "raise max_new_tokens (or max_scenarios) and rerun; documents already read are kept in " + str(out_dir))
        out = []
        for d, text in documents.items():
            mem = got[d]
            if mem.document != text:
                raise ChunkerError(f"{self.method}: {out_dir} holds other text for {d!r}",
                                   f"delete {out_dir.parent} and rerun")
            mem.meta = {**mem.meta, "chunker": self.method, "chunk_chars": int(chunk_chars)}
            out.append(mem)
        return out

    def note(self, memories: list[DocumentMemory]) -> str:
        fallbacks = [m.doc_id for m in memories if "fallback" in m.meta]
        windowed = sum("windows" in m.meta for m in memories)
        parts = [f"model {self.settings.lm}" + (f" + adapter {self.adapter}" if self.adapter else "") + ", guided"]
        if windowed:
            parts.append(f"{windowed} long document(s) read in windows and merged")
        if fallbacks:
            parts.append(f"WARNING: {len(fallbacks)} whole-document fallback(s): {fallbacks[:5]}")
        return "; ".join(parts)


def teacher_memories(documents: dict[str, str], path: str) -> list[DocumentMemory]:
    """The teacher's memory of every document, from a ``memreader gen`` memories JSONL."""
    if not path:
        raise ChunkerError("the teacher method needs settings.teacher_memories (empty)",
                           "set teacher_memories=<run>/gen/memories.jsonl written by `memreader gen`")
    if not Path(path).is_file():
        raise ChunkerError(f"teacher_memories={path} does not exist", "run `memreader gen` on these documents first")
    try:
        by_id = {m.doc_id: m for m in read_memories(path)}
    except MemoryValidationError as exc:
        raise ChunkerError(f"teacher_memories={path} is not a valid memories file: {exc}",
                           "regenerate it with `memreader gen`") from None
    missing = [d for d in documents if d not in by_id]
    if missing:
        raise ChunkerError(f"{path} has no teacher memory for {len(missing)} of {len(documents)} document(s): "
                           f"{missing[:8]}", "run `memreader gen` on those documents, or leave them out")
    changed = [d for d, t in documents.items() if by_id[d].document != t]
    if changed:
        raise ChunkerError(f"{path}: the teacher memory of {len(changed)} document(s) was made from other text: "
                           f"{changed[:8]}", "regenerate the teacher memories from this corpus")
    for d in documents:
        by_id[d].meta = {**by_id[d].meta, "chunker": "teacher", "source": str(path)}
    return [by_id[d] for d in documents]
