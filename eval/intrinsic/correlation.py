"""Intrinsic quality against the QA metrics across methods: the report's one correlation table.

    rows = correlation_table(methods, n_resamples, seed)   # one CorrelationRow per (intrinsic, QA metric)
    row = correlation_row(methods, "clarity", "rouge_l", n_resamples, seed)   # MoM Table 2's
    corr = correlate([MethodRow("memreader", rouge_per_question, clarity_per_document), ...])

Details (which methods enter a row, the paired bootstrap over questions and documents): docs/EVALUATION.md
(Informational support and clarity: Clarity vs ROUGE-L; Intrinsic chunk quality (MoC): The correlation table).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from memreader.eval.intrinsic.measures import IntrinsicError
from memreader.eval.stats import (
    DEFAULT_CONFIDENCE,
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    Interval,
    by_id,
    percentile_interval,
    resample_weights,
)

Values = tuple[list[str], list[float | None]]
"""A method's (doc_ids, per-memory values) of one intrinsic metric."""

#: name -> (what is better, getter of a method record's :data:`Values`, or None where not measured)
INTRINSIC: dict[str, tuple[str, Callable[[Any], Values | None]]] = {
    "clarity": ("higher", lambda r: (r.clarity.doc_ids, r.clarity.per_memory) if r.clarity else None),
    "boundary clarity": ("higher", lambda r: (r.clarity.doc_ids, r.clarity.boundary_clarity)
                         if r.clarity and r.clarity.boundary_clarity is not None else None),
    "stickiness": ("lower", lambda r: (r.stickiness.doc_ids, list(r.stickiness.per_memory)) if r.stickiness else None),
}
QA = ("bleu_1", "rouge_l", "meteor")
MIN_METHODS = 3


class CorrelationError(IntrinsicError):
    """Inputs a correlation cannot be computed from."""


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


def method_rows(have: dict[str, Any], get: Callable[[Any], Values | None], qa: str) -> list[MethodRow]:
    """:func:`correlate`'s rows: each method's ``qa`` metric per question (the questions every method scored, none
    excluded anywhere) and ``get``'s per-document values (aligned on the union of documents)."""
    drop = {i for m in have.values() for i in m.record.scores.excluded_ids}
    per_q = {n: by_id(m.record.scores.ids, m.record.scores.metrics[qa].per_example, drop) for n, m in have.items()}
    questions = [i for i in next(iter(per_q.values())) if all(i in v for v in per_q.values())]
    docs = list(dict.fromkeys(d for m in have.values() for d in get(m.record)[0]))
    return [MethodRow(n, [per_q[n][i] for i in questions], [by_id(*get(m.record)).get(d) for d in docs])
            for n, m in have.items()]


@dataclass(frozen=True)
class CorrelationRow:
    """One row of the correlation table: an intrinsic metric against a QA metric across ``methods`` (those the
    filter let in), its :class:`Correlation`, or a ``note`` saying why there is none."""

    intrinsic: str
    qa: str
    methods: list[str]
    correlation: Correlation | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form: names, methods, then the correlation's fields or the note."""
        row: dict[str, Any] = {"intrinsic": self.intrinsic, "qa": self.qa, "methods": sorted(self.methods)}
        return {**row, **self.correlation.to_dict()} if self.correlation else {**row, "note": self.note}


def _defined(values: Values | None) -> bool:
    return values is not None and any(v is not None for v in values[1])


def correlation_row(methods: dict[str, Any], intrinsic: str, qa: str, n_resamples: int = DEFAULT_RESAMPLES,
                    seed: int = DEFAULT_SEED) -> CorrelationRow:
    """``intrinsic`` (a key of :data:`INTRINSIC`) against ``qa`` across the methods the filter lets in (module
    docstring); ``methods``: name -> an object with a ``record`` (:class:`memreader.eval.records.MethodRecord`)."""
    get = INTRINSIC[intrinsic][1]
    have = {n: m for n, m in methods.items() if qa in m.record.scores.metrics and _defined(get(m.record))}
    if len(have) < MIN_METHODS:
        return CorrelationRow(intrinsic, qa, list(have), note=(
            f"needs at least {MIN_METHODS} methods with {intrinsic} and {qa}; this run has {len(have)}"
            f"{' (' + ', '.join(have) + ')' if have else ''}"))
    try:
        return CorrelationRow(intrinsic, qa, list(have), correlate(method_rows(have, get, qa), n_resamples, seed))
    except CorrelationError as err:
        return CorrelationRow(intrinsic, qa, list(have), note=str(err))


def correlation_table(methods: dict[str, Any], n_resamples: int = DEFAULT_RESAMPLES,
                      seed: int = DEFAULT_SEED) -> list[CorrelationRow]:
    """:func:`correlation_row` for every intrinsic metric and every QA metric of :data:`QA`, in that order."""
    return [correlation_row(methods, name, qa, n_resamples, seed) for name in INTRINSIC for qa in QA]
