"""Atomic-chunk clarity of every method's chunks, and its correlation with ROUGE-L across methods.

    values = chunk_clarity(scorer, memories)            # per memory: float, or None (one chunk, no boundary)
    summary = clarity_summary(scorer, memories)         # the "clarity" entry of an eval summary
    corr = correlate([MethodRow("memreader", rouge_per_question, clarity_per_document), ...])

Clarity is :class:`memreader.core.scoring.EvaluatorScorer`'s ``S_clarity`` in the scorer's own variant
(``settings.clarity_variant``; ``ppl`` by default), the mean over a memory's chunk boundaries. A memory
with one chunk has no boundary: its clarity is ``None`` here (not the scorer's neutral value), it is
counted in ``n_single_chunk`` and left out of means.

:func:`correlate` (MoM Table 2): one point per method, ``x`` = mean clarity over its documents,
``y`` = mean ROUGE-L over the questions; Pearson's r and Spearman's rho of those points (scipy).
Bootstrap interval: questions and documents are resampled, each with one draw shared by every method
(paired: all methods see the same resampled questions and the same resampled documents), questions
with :func:`eval.stats.resample_weights` ``(n_questions, n_resamples, seed)`` and documents
independently with ``(n_documents, n_resamples, seed + 1)``. Per draw every method's means are
recomputed (a document whose clarity is ``None`` for a method stays out of that method's mean) and
then both correlations. The interval is the percentile interval of the draws where the correlation
is defined (a draw where all methods tie on one axis is counted in ``n_undefined`` and left out).
The set of methods is fixed, not resampled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from memreader.core.errors import MemReaderError
from memreader.eval.records import ClarityRecord
from memreader.eval.stats import (
    DEFAULT_CONFIDENCE,
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    Interval,
    percentile_interval,
    resample_weights,
)

#: Bump when the meaning of a clarity value or of the correlation changes (it is in every signature).
CLARITY_REPORT_VERSION = "2"  # 2: the record carries boundary clarity (eval/intrinsic.py)


class CorrelationError(MemReaderError, ValueError):
    """Inputs a correlation cannot be computed from."""


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


def chunk_clarity(scorer: Any, memories: Sequence[Any], block: int = 32) -> list[float | None]:
    """Clarity of each memory with ``scorer`` (an :class:`~memreader.core.scoring.EvaluatorScorer`), scored
    ``block`` memories per call; ``None`` for a memory with a single chunk."""
    return [None if s.single_chunk else float(s.clarity) for s in chunk_scores(scorer, memories, block)]


def clarity_signature(scorer: Any) -> str:
    """A one-line signature of an :class:`~memreader.core.scoring.EvaluatorScorer` (or of its
    :meth:`~memreader.core.scoring.EvaluatorScorer.signature` dict)."""
    s = scorer if isinstance(scorer, dict) else scorer.signature()
    return (f"Clarity|variant:{s['variant']}|evaluator:{s['evaluator']}|format:{s['format_version']}|"
            f"K:{s.get('ppl_target_tokens')}|M:{s.get('max_chunk_tokens')}|T:{s.get('ppl_temperature')}|"
            f"dtype:{s.get('dtype')}|backend:{s.get('backend')}|single:none|mr-clarity:{CLARITY_REPORT_VERSION}")


def clarity_summary(scorer: Any, memories: Sequence[Any], block: int = 32) -> dict[str, Any]:
    """The ``clarity`` entry of an evaluation summary for one method's memories
    (:class:`eval.records.ClarityRecord`)."""
    return ClarityRecord.of(chunk_clarity(scorer, memories, block), [m.doc_id for m in memories],
                            clarity_signature(scorer)).to_dict()


@dataclass(frozen=True)
class MethodRow:
    """One method: ROUGE-L per question and clarity per document (``None``: no boundary), both aligned
    with every other method's (same questions, same documents, same order)."""

    method: str
    rouge_l: Sequence[float]
    clarity: Sequence[float | None]


@dataclass(frozen=True)
class Correlation:
    """Pearson and Spearman correlation of mean clarity with mean ROUGE-L across methods."""

    methods: list[str]
    clarity_means: list[float]
    rouge_means: list[float]
    pearson: float
    pearson_interval: Interval | None
    spearman: float
    spearman_interval: Interval | None
    n_questions: int
    n_documents: int
    n_undefined: dict[str, int]
    resampled: str

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        out = dict(self.__dict__)
        for key in ("pearson_interval", "spearman_interval"):
            out[key] = out[key].to_dict() if out[key] is not None else None
        return out


def _rank(x: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(x, axis=-1)


def _rowwise_pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson r of each row pair of ``(b, k)`` matrices; NaN where a row is constant."""
    xc, yc = x - x.mean(axis=1, keepdims=True), y - y.mean(axis=1, keepdims=True)
    den = np.sqrt((xc * xc).sum(axis=1) * (yc * yc).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (xc * yc).sum(axis=1) / den
    # rounding noise of a constant row: treat relative spread below 1e-12 as constant
    flat = (np.ptp(x, axis=1) <= 1e-12 * np.maximum(1.0, np.abs(x).max(axis=1))) | (
        np.ptp(y, axis=1) <= 1e-12 * np.maximum(1.0, np.abs(y).max(axis=1)))
    return np.where(flat, np.nan, np.clip(r, -1.0, 1.0))


def correlate(rows: Sequence[MethodRow], n_resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED,
              confidence: float = DEFAULT_CONFIDENCE) -> Correlation:
    """Pearson and Spearman correlation of clarity with ROUGE-L across ``rows`` (see module docstring)."""
    if len(rows) < 3:
        raise CorrelationError(f"a correlation across methods needs at least 3 methods, got {len(rows)} "
                               f"({', '.join(r.method for r in rows) or 'none'})",
                               "evaluate more chunking methods (baselines) in the same run")
    n_q, n_d = len(rows[0].rouge_l), len(rows[0].clarity)
    bad = [r.method for r in rows if len(r.rouge_l) != n_q or len(r.clarity) != n_d]
    if bad or n_q == 0 or n_d == 0:
        raise CorrelationError(f"per-question ROUGE-L and per-document clarity must be non-empty and aligned across "
                               f"methods ({n_q} questions, {n_d} documents in {rows[0].method}; differing: {bad})")
    rouge = np.array([np.asarray(r.rouge_l, dtype=float) for r in rows])  # (k, n_q)
    clar = np.array([[np.nan if v is None else float(v) for v in r.clarity] for r in rows])  # (k, n_d)
    valid = ~np.isnan(clar)
    empty = [r.method for r, v in zip(rows, valid, strict=True) if not v.any()]
    if empty:
        raise CorrelationError(f"methods without any document with a chunk boundary: {empty}",
                               "their clarity is undefined; leave them out of the correlation")
    clar0 = np.where(valid, clar, 0.0)
    x, y = clar0.sum(axis=1) / valid.sum(axis=1), rouge.mean(axis=1)
    pearson = float(_rowwise_pearson(x[None], y[None])[0])
    spearman = float(_rowwise_pearson(_rank(x[None]), _rank(y[None]))[0])
    draws_p, draws_s = [], []
    for wq, wd in zip(resample_weights(n_q, n_resamples, seed), resample_weights(n_d, n_resamples, seed + 1),
                      strict=True):
        ym = wq @ rouge.T / n_q  # (b, k)
        with np.errstate(invalid="ignore", divide="ignore"):
            xm = (wd @ clar0.T) / (wd @ valid.T)  # NaN where a method drew none of its valid documents
        ok = ~np.isnan(xm).any(axis=1)
        p, s = np.full(len(xm), np.nan), np.full(len(xm), np.nan)
        p[ok] = _rowwise_pearson(xm[ok], ym[ok])
        s[ok] = _rowwise_pearson(_rank(xm[ok]), _rank(ym[ok]))
        draws_p.append(p)
        draws_s.append(s)
    dp, ds = np.concatenate(draws_p), np.concatenate(draws_s)

    def interval(d: np.ndarray) -> Interval | None:
        d = d[~np.isnan(d)]
        return percentile_interval(d, confidence, n_resamples, seed) if len(d) else None

    return Correlation(
        methods=[r.method for r in rows], clarity_means=x.tolist(), rouge_means=y.tolist(),
        pearson=pearson, pearson_interval=interval(dp), spearman=spearman, spearman_interval=interval(ds),
        n_questions=n_q, n_documents=n_d,
        n_undefined={"pearson": int(np.isnan(dp).sum()), "spearman": int(np.isnan(ds).sum())},
        resampled=(f"questions (n={n_q}, seed {seed}) and documents (n={n_d}, seed {seed + 1}) independently, "
                   f"each draw shared by all {len(rows)} methods; methods fixed; {n_resamples} resamples"),
    )
