"""Bootstrap confidence intervals and paired significance tests over per-example scores.

    from memreader.eval.stats import bootstrap_ci, paired_bootstrap, paired_test
    ci = bootstrap_ci(per_example_scores, seed=12345)        # Interval(low=..., high=..., ...)
    test = paired_bootstrap(scores_a, scores_b, seed=12345)   # delta, its interval, p-value
    test = paired_test(ids_a, scores_a, ids_b, scores_b, drop=excluded_ids)   # the same, on the items both scored

Each draw is a vector of multinomial weights shared by every metric and system (a resampled mean is
``weights @ values / n``, a corpus statistic ``weights @ counts``), hence not ``scipy.stats.bootstrap``.
:func:`paired_test` is the one paired comparison (``memreader score --baseline``, ``memreader report``).
Details: docs/EVALUATION.md (What is computed by which library).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

DEFAULT_SEED = 12345
DEFAULT_RESAMPLES = 1000
DEFAULT_CONFIDENCE = 0.95
_BLOCK = 100  # resamples drawn per block, bounding memory at block * n weights


@dataclass(frozen=True)
class Interval:
    """A percentile bootstrap interval and how it was drawn."""

    low: float
    high: float
    confidence: float
    n_resamples: int
    seed: int
    method: str = "percentile-bootstrap"

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return asdict(self)


@dataclass(frozen=True)
class PairedTest:
    """System A minus system B on the same items: mean difference, its interval, two p-values."""

    delta: float
    interval: Interval
    p_bootstrap: float
    p_permutation: float
    n: int

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        out = asdict(self)
        out["interval"] = self.interval.to_dict()
        return out


def resample_weights(n: int, n_resamples: int, seed: int) -> Iterator[np.ndarray]:
    """Blocks of bootstrap draws as ``(block, n)`` integer weight matrices (rows sum to ``n``).

    The same ``(n, n_resamples, seed)`` always yields the same draws.
    """
    if n < 1:
        raise ValueError("cannot resample an empty set of examples")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be at least 1, got {n_resamples}")
    rng = np.random.default_rng(seed)
    probs = np.full(n, 1.0 / n)
    for size in _blocks(n_resamples):
        yield rng.multinomial(n, probs, size=size)


def _blocks(n_resamples: int) -> list[int]:
    """Sizes of the blocks ``n_resamples`` draws are made in (at most :data:`_BLOCK` each)."""
    return [min(_BLOCK, n_resamples - done) for done in range(0, n_resamples, _BLOCK)]


def bootstrap_distribution(n: int, statistic: Callable[[np.ndarray], np.ndarray], n_resamples: int = DEFAULT_RESAMPLES,
                           seed: int = DEFAULT_SEED) -> np.ndarray:
    """``statistic`` (weights ``(b, n)`` -> values ``(b,)``) evaluated on every bootstrap draw."""
    return np.concatenate([np.asarray(statistic(w), dtype=float) for w in resample_weights(n, n_resamples, seed)])


def percentile_interval(draws: np.ndarray, confidence: float, n_resamples: int, seed: int) -> Interval:
    """The central ``confidence`` interval of bootstrap ``draws``."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(draws, [tail, 100.0 - tail])
    return Interval(float(low), float(high), confidence, n_resamples, seed)


def bootstrap_ci(values: Sequence[float] | np.ndarray, n_resamples: int = DEFAULT_RESAMPLES,
                 confidence: float = DEFAULT_CONFIDENCE, seed: int = DEFAULT_SEED) -> Interval:
    """Percentile bootstrap interval of the mean of ``values``."""
    v = np.asarray(values, dtype=float)
    draws = bootstrap_distribution(len(v), lambda w: w @ v / len(v), n_resamples, seed)
    return percentile_interval(draws, confidence, n_resamples, seed)


def bootstrap_cis(columns: np.ndarray, n_resamples: int = DEFAULT_RESAMPLES, confidence: float = DEFAULT_CONFIDENCE,
                  seed: int = DEFAULT_SEED) -> list[Interval]:
    """:func:`bootstrap_ci` for every column of an ``(n, k)`` matrix, from one set of draws (the
    draws depend only on ``n`` and ``seed``, so each interval equals its single-column version)."""
    m = np.asarray(columns, dtype=float)
    draws = bootstrap_distribution(len(m), lambda w: w @ m / len(m), n_resamples, seed)
    return [percentile_interval(draws[:, j], confidence, n_resamples, seed) for j in range(m.shape[1])]


def _bootstrap_p(draws: np.ndarray, observed: float) -> float:
    # sacrebleu's paired-bootstrap p-value: centre the draws (null of no difference) and count how
    # often a difference at least as large as the observed one appears.
    centred = np.abs(draws - draws.mean())
    return float((np.sum(centred >= abs(observed)) + 1) / (len(draws) + 1))


def permutation_p(diffs: Sequence[float] | np.ndarray, n_resamples: int = DEFAULT_RESAMPLES,
                  seed: int = DEFAULT_SEED) -> float:
    """Two-sided paired permutation (sign-flip) test of ``mean(diffs) == 0``; add-one p-value."""
    d = np.asarray(diffs, dtype=float)
    if len(d) == 0:
        raise ValueError("cannot test an empty set of differences")
    observed = abs(d.mean())
    rng = np.random.default_rng(seed)
    hits = 0
    for size in _blocks(n_resamples):
        signs = rng.choice(np.array([-1.0, 1.0]), size=(size, len(d)))
        # A tiny tolerance so ties with the observed statistic count despite float rounding.
        hits += int(np.sum(np.abs(signs @ d / len(d)) >= observed - 1e-12))
    return (hits + 1) / (n_resamples + 1)


def paired_bootstrap(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray,
                     n_resamples: int = DEFAULT_RESAMPLES, confidence: float = DEFAULT_CONFIDENCE,
                     seed: int = DEFAULT_SEED) -> PairedTest:
    """Compare two systems scored on the same items (``a[i]`` and ``b[i]`` are the same item)."""
    va, vb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if va.shape != vb.shape:
        raise ValueError(f"paired scores must align: {len(va)} vs {len(vb)} items")
    d = va - vb
    draws = bootstrap_distribution(len(d), lambda w: w @ d / len(d), n_resamples, seed)
    return PairedTest(float(d.mean()), percentile_interval(draws, confidence, n_resamples, seed),
                      _bootstrap_p(draws, float(d.mean())), permutation_p(d, n_resamples, seed), len(d))


class NotComparable(ValueError):
    """Two systems' scores a paired test cannot be run on; the message says why."""


def by_id(ids: Sequence[Any], values: Sequence[Any], drop: Sequence[Any] = ()) -> dict[str, Any]:
    """``values`` keyed by their ids (as strings), those in ``drop`` left out."""
    skip = {str(i) for i in drop}
    return {str(i): v for i, v in zip(ids, values, strict=True) if str(i) not in skip}


def _unique_by_id(ids: Sequence[Any], values: Sequence[Any], drop: Sequence[Any]) -> dict[str, Any]:
    if len({str(i) for i in ids}) != len(ids):
        raise NotComparable("an id appears twice among the scored items; a paired test needs one score per item")
    return by_id(ids, values, drop)


def paired_test(a_ids: Sequence[Any], a: Sequence[float | None], b_ids: Sequence[Any], b: Sequence[float | None],
                drop: Sequence[Any] = (), n_resamples: int = DEFAULT_RESAMPLES, confidence: float = DEFAULT_CONFIDENCE,
                seed: int = DEFAULT_SEED) -> PairedTest:
    """System ``a`` minus system ``b`` (:func:`paired_bootstrap`) on the items both scored: ids (compared as
    strings) in both lists, neither score None, none in ``drop`` (e.g. the items either system excluded); in
    ``a``'s order. :class:`NotComparable` when no item is left or an id repeats."""
    va, vb = _unique_by_id(a_ids, a, drop), _unique_by_id(b_ids, b, drop)
    common = [i for i, v in va.items() if v is not None and vb.get(i) is not None]
    if not common:
        raise NotComparable("no item scored for both")
    return paired_bootstrap([va[i] for i in common], [vb[i] for i in common], n_resamples, confidence, seed)


def paired_bootstrap_statistic(n: int, statistic_a: Callable[[np.ndarray], np.ndarray],
                               statistic_b: Callable[[np.ndarray], np.ndarray], observed: float,
                               n_resamples: int = DEFAULT_RESAMPLES, confidence: float = DEFAULT_CONFIDENCE,
                               seed: int = DEFAULT_SEED) -> tuple[Interval, float]:
    """Interval and bootstrap p-value of ``statistic_a - statistic_b`` for non-mean statistics
    (corpus BLEU), both evaluated on the same draws."""
    draws = bootstrap_distribution(n, lambda w: statistic_a(w) - statistic_b(w), n_resamples, seed)
    return percentile_interval(draws, confidence, n_resamples, seed), _bootstrap_p(draws, observed)


def corpus_bleu_from_counts(counts: np.ndarray, max_order: int, smoothing: str,
                            brevity_penalty: bool) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised corpus ``(BLEU-1, BLEU-Avg)`` for rows of summed counts.

    ``counts`` columns: matches[1..N], possible[1..N], hyp_len, ref_len (as in
    :class:`memreader.eval.metrics.BleuStats`). Mirrors :func:`memreader.eval.metrics.bleu_from_stats` for bootstrap
    draws; the headline number itself always comes from the exact scalar function.
    """
    counts = np.atleast_2d(np.asarray(counts, dtype=float))
    m, p = counts[:, :max_order], counts[:, max_order : 2 * max_order]
    hyp, ref = counts[:, 2 * max_order], counts[:, 2 * max_order + 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        prec = (m + 1.0) / (p + 1.0) if smoothing == "add1" else np.where(p > 0, m / np.where(p > 0, p, 1), 0.0)
        positive = prec.min(axis=1) > 0
        geo = np.where(positive, np.exp(np.sum(np.log(np.where(prec > 0, prec, 1.0)) / max_order, axis=1)), 0.0)
        ratio = np.where(ref > 0, hyp / np.where(ref > 0, ref, 1), np.inf)
        bp = np.where(hyp == 0, 0.0, np.where(ratio > 1.0, 1.0, np.exp(1 - 1.0 / ratio)))
    # Without the penalty CRUD-RAG divides it back out, defining 0 where the penalty is 0.
    bleu = geo * bp if brevity_penalty else np.where(bp == 0, 0.0, geo)
    return prec[:, 0], bleu
