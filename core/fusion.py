"""Rank fusion: reciprocal rank fusion (RRF) and the hit types of layered retrieval.

A ranked list is labelled by its layer (``chunk``: vector search) or ``<layer>/bm25``; :func:`split_by_layer`
recovers each layer's own exact top k from one search over several layers. Why RRF is written here, and its exact
ties: docs/RETRIEVAL.md (Search modes).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from memreader.core.config import field as config_field
from memreader.core.structure import where_from_json

K = TypeVar("K", bound=Hashable)

OUTLINE, CORE, CHUNK, SINGLE = "outline", "core", "chunk", "single"
LAYERS = (OUTLINE, CORE, CHUNK)
"""The three layers of a document memory that three-layer retrieval searches independently."""
ALL_LAYERS = (*LAYERS, SINGLE)
"""Everything an index holds: the three layers plus one averaged vector per scenario."""
DENSE, BM25 = "dense", "bm25"
"""The two signals a list can rank by: embedding similarity, or BM25 over the row's text."""


def bm25_label(layer: str) -> str:
    """The list label of a layer's BM25 ranking (``chunk`` -> ``chunk/bm25``); dense lists are the bare layer."""
    return f"{layer}/{BM25}"


def split_label(label: str) -> tuple[str, str]:
    """``(layer, signal)`` of a list label: ``chunk/bm25`` -> ``(chunk, bm25)``, ``core`` -> ``(core, dense)``."""
    layer, _, signal = label.partition("/")
    if signal not in ("", BM25):
        raise ValueError(f"list label {label!r} is neither a layer nor '<layer>/{BM25}'")
    return layer, signal or DENSE


RRF_K = 60.0
"""The usual reciprocal rank fusion constant (Cormack et al.; MoM uses it too): every ``rrf_k`` default."""
RRF_K_MIN = 0.0
"""The least k: ranks start at 1, so ``1/(k + rank)`` is defined (at most 1) for every k >= 0. A small k only lets
one first place outweigh agreement further down; that is a setting, not an error."""


def rrf_k_problem(k: Any) -> str | None:
    """The one rule for RRF's k, wherever rankings are fused (a config key, a settings object, a direct call): a
    finite number >= :data:`RRF_K_MIN`. Returns what is wrong, or None."""
    if isinstance(k, bool) or not isinstance(k, (int, float)) or not math.isfinite(k) or k < RRF_K_MIN:
        return (f"rrf_k={k!r}: RRF's k must be a finite number >= {RRF_K_MIN:g} (ranks start at 1); "
                f"the usual value is {RRF_K:g}")
    return None


def rrf_k_field(what: str) -> Any:
    """The ``rrf_k`` key of every config that fuses rankings: the same default, range and check
    (:func:`rrf_k_problem`) wherever it appears. ``what`` says what is fused."""
    return config_field(RRF_K, ge=RRF_K_MIN, check=rrf_k_problem,
                        help=f"reciprocal rank fusion constant k for {what}: score = sum 1/(k + rank) "
                        f"(a finite number >= {RRF_K_MIN:g}; usual value {RRF_K:g})")


def reciprocal_rank_fusion(rankings: Sequence[Sequence[K]], k: float = RRF_K) -> list[tuple[K, float]]:
    """Fuse ranked lists: ``score(d) = sum over lists containing d of 1 / (k + rank(d))``.

    Ranks are 1-based. Returns ``(key, score)`` best first; equal scores are ordered by the key
    (ascending), so keys must be mutually orderable (ints, strings, tuples of them). A key listed
    twice in one ranking is an error: the ranking would vote for it twice.
    """
    if problem := rrf_k_problem(k):
        raise ValueError(problem)
    terms: dict[K, list[float]] = {}
    for li, ranking in enumerate(rankings):
        seen: set[K] = set()
        for rank, key in enumerate(ranking, start=1):
            if key in seen:
                raise ValueError(f"ranking {li} lists {key!r} more than once; deduplicate each ranking before fusing")
            seen.add(key)
            terms.setdefault(key, []).append(1.0 / (k + rank))
    scored = [(key, math.fsum(parts)) for key, parts in terms.items()]
    try:
        # Sort by key first (always compares keys, so a bad key type fails every time, not only on
        # a tie), then stably by score: equal scores keep key order.
        scored.sort(key=lambda item: item[0])  # type: ignore[arg-type, return-value]
    except TypeError as exc:
        raise TypeError(f"RRF breaks ties by the key, so keys must be mutually orderable ({exc}); use ints, strings "
                        "or tuples of them as keys") from exc
    scored.sort(key=lambda item: -item[1])
    return scored


ChunkKey = tuple[str, int]
"""A scenario's identity in an index: ``(doc_id, scenario index)``."""


@dataclass(frozen=True)
class LayerHit:
    """One row returned by one ranked list: a layer's vector search, or its BM25 search."""

    layer: str
    """The list's label: the layer (``outline``, ``core``, ``chunk``, ``single``) for a vector
    search, ``<layer>/bm25`` (e.g. ``chunk/bm25``) for a BM25 search of that layer."""
    rank: int
    """1-based rank within this list."""
    similarity: float
    """Cosine similarity between the query and the row's vector; for a BM25 list, the BM25 score
    (positive, unbounded, comparable only within one list)."""
    doc_id: str
    scenario: int
    start: int
    end: int
    text: str
    """The row's own text: the outline item, the core content or the chunk (empty for ``single``)."""
    version: str = ""
    """The content hash of the memory version the row belongs to (an index of format 3; "" otherwise)."""
    generation: int = 0
    """The index generation (build or update) that wrote the row."""
    origin: str = ""
    """JSON of the scenario's source file, pages and heading path ("" when the corpus had none)."""

    @property
    def where(self) -> dict[str, Any]:
        """The scenario's ``source``, ``pages`` and ``headings`` (empty values when unknown)."""
        return where_from_json(self.origin)

    @property
    def key(self) -> ChunkKey:
        """The chunk this row belongs to."""
        return (self.doc_id, self.scenario)

    @property
    def base_layer(self) -> str:
        """The layer of the row (``chunk`` for both ``chunk`` and ``chunk/bm25``)."""
        return split_label(self.layer)[0]

    @property
    def signal(self) -> str:
        """``dense`` (vector similarity) or ``bm25``."""
        return split_label(self.layer)[1]


@dataclass
class Hit:
    """One retrieved chunk: an exact span of its document, its fused score and its provenance."""

    doc_id: str
    scenario: int
    start: int
    end: int
    text: str
    """``document[start:end]``."""
    score: float
    """RRF score over the lists searched (one list in ``single`` / ``chunk_only`` mode)."""
    provenance: list[LayerHit] = field(default_factory=list)
    """The rows that voted for this chunk, in list order (dense layers first, then BM25 lists)."""
    where: dict[str, Any] = field(default_factory=dict)
    """The chunk's ``source`` file, ``pages`` and ``headings`` path (from ``memreader ingest``; empty otherwise)."""

    @property
    def layers(self) -> list[str]:
        """Labels of the lists that retrieved this chunk (``chunk/bm25`` for a BM25 list)."""
        return [p.layer for p in self.provenance]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (provenance without the repeated span fields)."""
        return {"doc_id": self.doc_id, "scenario": self.scenario, "start": self.start, "end": self.end,
                "score": self.score, "text": self.text, "source": self.where.get("source"),
                "pages": self.where.get("pages", []), "headings": self.where.get("headings", []),
                "provenance": [{"layer": p.layer, "signal": p.signal, "rank": p.rank, "similarity": p.similarity,
                                "text": p.text} for p in self.provenance]}


def fuse_layer_hits(
    layer_lists: Sequence[Sequence[LayerHit]], k: float = RRF_K
) -> list[tuple[ChunkKey, float, list[LayerHit]]]:
    """Map every layer hit to its chunk and fuse the lists with :func:`reciprocal_rank_fusion`.

    Each list must be ranked best first (``rank`` 1, 2, ...). Returns ``(chunk key, score,
    provenance)`` best first; ties are broken by ``(doc_id, scenario)``.
    """
    provenance: dict[ChunkKey, list[LayerHit]] = {}
    rankings: list[list[ChunkKey]] = []
    for hits in layer_lists:
        ranking = []
        for expected, hit in enumerate(hits, start=1):
            assert hit.rank == expected, f"layer {hit.layer} list is not ranked 1..n at {hit}"
            ranking.append(hit.key)
            provenance.setdefault(hit.key, []).append(hit)
        rankings.append(ranking)
    return [(key, score, provenance[key]) for key, score in reciprocal_rank_fusion(rankings, k=k)]


def rank_hits(hits: Iterable[LayerHit], limit: int) -> list[LayerHit]:
    """The best ``limit`` hits ranked 1..n; equal scores ordered by ``(doc_id, scenario)``, so a list
    is reproducible whatever order the store returned it in."""
    ordered = sorted(hits, key=lambda h: (-h.similarity, h.doc_id, h.scenario))[:limit]
    return [replace(h, rank=rank) for rank, h in enumerate(ordered, start=1)]


def split_by_layer(union: Sequence[LayerHit], layers: Sequence[str], limit: int,
                   asked: int) -> dict[str, list[LayerHit] | None]:
    """Each layer's exact top ``limit`` from one search over all ``layers`` together.

    ``union`` is what that search returned when asked for its best ``asked`` rows. Rows it left out
    score at most its last score, so the rows of a layer scoring *strictly* above that are exactly
    the layer's best rows (rows tied at the k-th score are then cut by ``(doc_id, scenario)``). A
    layer with fewer than ``limit`` such rows maps to ``None``: it needs its own search. An answer
    shorter than ``asked`` left nothing out, so every layer is complete.
    """
    cutoff = union[-1].similarity if union and len(union) >= asked else -math.inf
    out: dict[str, list[LayerHit] | None] = {}
    for layer in layers:
        mine = [h for h in union if h.base_layer == layer]
        complete = cutoff == -math.inf or sum(h.similarity > cutoff for h in mine) >= limit
        out[layer] = rank_hits(mine, limit) if complete else None
    return out
