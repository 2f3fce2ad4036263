"""What a document memory becomes in the index: the texts of each scenario, embedded into rows.

Every row carries its memory's content hash (``doc_hash``: what an incremental update compares), the
index generation that wrote it (``generation``) and where the scenario sits in its source file
(``origin``: JSON of the source path, pages and heading path when the corpus came from ``memreader
ingest``; empty otherwise). One scenario gives up to four rows — ``outline``, ``core``, ``chunk`` and ``single`` (the mean of
the scenario's unit vectors, renormalised: the paper's single-vector baseline). Blank texts are
never embedded: they are skipped and counted by reason, and a scenario whose chunk is only
whitespace is skipped whole (an outline or core hit would only point at whitespace).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from memreader.core.embedders import embedding_dim, encode  # noqa: F401  (re-exported for the index)
from memreader.core.fusion import ALL_LAYERS, CHUNK, CORE, OUTLINE, SINGLE
from memreader.core.schema import DocumentMemory
from memreader.core.structure import where
from memreader.retrieval.milvus import MAX_TEXT_BYTES, StoreError

MAX_DOC_ID_BYTES = 400  # leaves room for the "{layer}/{scenario}/{version}/" prefix in a 512-byte primary key
VERSION_CHARS = 16  # hex digits of the content hash in a primary key
MAX_ORIGIN_BYTES = 4096


class MemoryIndexError(StoreError):
    """The index is missing, incomplete, or does not match the embedder or the input."""


class Embedder(Protocol):
    """What the index needs from a sentence-transformers model."""

    def encode(self, sentences: Any, **kwargs: Any) -> Any: ...


def primary_key(layer: str, scenario: int, doc_id: str, doc_hash: str) -> str:
    """The row id: deterministic, so a rebuild writes the same keys and a chunk is fetched by key. The
    content hash is part of it, so two versions of a document can sit side by side during an update."""
    return f"{layer}/{scenario}/{doc_hash[:VERSION_CHARS]}/{doc_id}"


def memory_hash(mem: DocumentMemory) -> str:
    """sha256 of the memory's content (document, scenarios, reasoning, metadata): equal hashes, equal rows."""
    payload = json.dumps(mem.to_dict(), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def origin_json(mem: DocumentMemory, scenario: int) -> str:
    """The scenario's source file, pages and heading path as compact JSON ("" when the memory has none)."""
    found = where(mem, scenario)
    if not (found["source"] or found["pages"] or found["headings"]):
        return ""
    text = json.dumps(found, ensure_ascii=False, separators=(",", ":"))
    if len(text.encode()) > MAX_ORIGIN_BYTES:  # shortened, never cut mid-JSON: first and last page, short headings
        pages = found["pages"]
        found["pages"] = [pages[0], pages[-1]] if len(pages) > 2 else pages
        found["headings"] = [h[:80] for h in found["headings"]][-8:]
        text = json.dumps(found, ensure_ascii=False, separators=(",", ":"))
        while len(text.encode()) > MAX_ORIGIN_BYTES and (found["headings"] or len(str(found["source"])) > 80):
            if found["headings"]:
                found["headings"] = found["headings"][1:]
            else:
                found["source"] = "..." + str(found["source"])[-80:]
            text = json.dumps(found, ensure_ascii=False, separators=(",", ":"))
    return text


@dataclass
class BuildSummary:
    """What one index build wrote."""

    uri: str
    collection: str
    embedder: str
    documents: int = 0
    scenarios: int = 0
    rows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ALL_LAYERS, 0))
    skipped: dict[str, int] = field(default_factory=dict)
    """Rows not written, by reason (``empty outline``, ``empty core``, ``blank chunk``)."""
    seconds: float = 0.0
    plan: Any = None
    """The :class:`~memreader.retrieval.updates.UpdatePlan`: documents added, replaced, unchanged, removed, stale."""
    update: bool = False
    """An update in place (``replace=False`` over an existing index), not a full build."""
    deleted_rows: int = 0
    """Rows deleted since the last full build (Milvus still counts them in its BM25 statistics)."""
    live_rows: int = 0
    """Rows in the index after an update."""

    def bm25_drift_note(self) -> str:
        """The warning an update prints when deleted rows still weigh on BM25 scores ("" when none)."""
        if not self.deleted_rows:
            return ""
        share = self.deleted_rows / max(1, self.deleted_rows + self.live_rows)
        return (f"NOTE: {self.deleted_rows} rows were deleted since the last full build ({share:.1%} of all rows "
                "written): Milvus still counts them in BM25 statistics until it compacts (Milvus Lite never does), so "
                "hybrid / chunk_hybrid / MeVe-fallback scores differ slightly from a fresh build; dense modes are "
                "exact. Rebuild with --set replace=true to reset them.")

    @property
    def total_rows(self) -> int:
        """All rows written, over every layer."""
        return sum(self.rows.values())

    def line(self) -> str:
        """The one-line summary printed at the end of a build."""
        per_layer = ", ".join(f"{layer} {n}" for layer, n in self.rows.items())
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items())) or "none"
        rate = self.total_rows / self.seconds if self.seconds > 0 else 0.0
        changes = ""
        if self.update and self.plan is not None:
            changes = "; update: " + ", ".join(f"{n} {k}" for k, n in self.plan.counts().items())
        return (f"indexed {self.documents} documents, {self.scenarios} scenarios written: {self.total_rows} rows "
                f"({per_layer}); skipped {skipped}{changes}; {self.seconds:.1f} s ({rate:.1f} rows/s) -> {self.uri}")


@dataclass
class ScenarioTexts:
    """The non-blank texts of one scenario, by layer, with its identity and chunk span."""

    doc_id: str
    scenario: int
    start: int
    end: int
    texts: dict[str, str]
    doc_hash: str = ""
    origin: str = ""


def scenario_texts(mem: DocumentMemory, skipped: Counter[str]) -> list[ScenarioTexts]:
    """The texts to embed for one memory (validated first); blank ones are counted in ``skipped``."""
    mem.validate()
    if len(mem.doc_id.encode()) > MAX_DOC_ID_BYTES:
        raise MemoryIndexError(f"doc_id {mem.doc_id[:60]!r}... is over {MAX_DOC_ID_BYTES} bytes; shorten it")
    out = []
    doc_hash = memory_hash(mem)
    for i, sc in enumerate(mem.scenarios):
        chunk = mem.document[sc.start : sc.end]
        if not chunk.strip():
            skipped["blank chunk"] += 1
            continue
        texts: dict[str, str] = {}
        for layer, text in ((OUTLINE, sc.outline), (CORE, sc.core), (CHUNK, chunk)):
            if not text.strip():
                skipped[f"empty {layer}"] += 1
                continue
            if len(text.encode()) > MAX_TEXT_BYTES:
                raise MemoryIndexError(f"doc {mem.doc_id!r} scenario {i}: {layer} is {len(text.encode())} bytes, over "
                                       f"Milvus' {MAX_TEXT_BYTES}-byte text limit; re-read the document with smaller "
                                       "windows")
            texts[layer] = text
        out.append(ScenarioTexts(mem.doc_id, i, sc.start, sc.end, texts, doc_hash, origin_json(mem, i)))
    return out


def _row(s: ScenarioTexts, layer: str, text: str, vector: np.ndarray, generation: int) -> dict[str, Any]:
    return {
        "pk": primary_key(layer, s.scenario, s.doc_id, s.doc_hash), "layer": layer, "doc_id": s.doc_id,
        "scenario": s.scenario, "start": s.start, "end": s.end, "doc_hash": s.doc_hash, "generation": generation,
        "origin": s.origin, "text": text, "vector": vector.astype(np.float32).tolist(),
    }


def embed_rows(scenarios: Sequence[ScenarioTexts], embedder: Embedder, batch_size: int,
               generation: int = 1) -> list[dict[str, Any]]:
    """Embed every text of ``scenarios`` in batches and return the Milvus rows, ``single`` included, stamped
    with ``generation``."""
    texts = [t for s in scenarios for t in s.texts.values()]
    if not texts:
        return []
    vectors = encode(embedder, texts, batch_size)
    rows: list[dict[str, Any]] = []
    i = 0
    for s in scenarios:
        own = vectors[i : i + len(s.texts)]
        i += len(s.texts)
        for (layer, text), vec in zip(s.texts.items(), own, strict=True):
            rows.append(_row(s, layer, text, vec, generation))
        mean = own.mean(axis=0)
        norm = float(np.linalg.norm(mean))
        # Unit vectors of one scenario cancelling out exactly would take an adversarial embedder.
        assert norm > 0, f"{s.doc_id} scenario {s.scenario}: layer vectors average to zero"
        rows.append(_row(s, SINGLE, "", mean / norm, generation))
    assert i == len(vectors), "every embedded text maps to exactly one row"
    return rows
