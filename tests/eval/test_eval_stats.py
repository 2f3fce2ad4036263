"""Bootstrap intervals and paired tests: reproducible from the seed, and correct against closed forms."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from memreader.eval.metrics import BleuStats, bleu_from_stats, resolve_config
from memreader.eval.stats import (
    NotComparable,
    bootstrap_ci,
    bootstrap_cis,
    corpus_bleu_from_counts,
    paired_bootstrap,
    paired_test,
    percentile_interval,
    permutation_p,
    resample_weights,
)


def test_weights_are_reproducible_resamples() -> None:
    a = np.vstack(list(resample_weights(50, 250, seed=7)))
    b = np.vstack(list(resample_weights(50, 250, seed=7)))
    assert a.shape == (250, 50) and (a.sum(axis=1) == 50).all() and (a == b).all()
    assert not (a == np.vstack(list(resample_weights(50, 250, seed=8)))).all()


def test_interval_matches_the_normal_approximation() -> None:
    values = np.random.default_rng(0).normal(0.5, 0.1, size=2000)
    ci = bootstrap_ci(values, n_resamples=2000, seed=1)
    half = 1.96 * values.std(ddof=1) / np.sqrt(len(values))
    assert ci.low < values.mean() < ci.high
    assert (ci.high - ci.low) / 2 == pytest.approx(half, rel=0.1)
    assert (ci.confidence, ci.n_resamples, ci.seed) == (0.95, 2000, 1)
    assert bootstrap_ci(values, n_resamples=2000, seed=1) == ci  # the seed fixes the interval


def test_shared_draws_for_several_columns() -> None:
    m = np.random.default_rng(2).uniform(size=(400, 3))
    together = bootstrap_cis(m, n_resamples=300, seed=9)
    for j in range(3):
        alone = bootstrap_ci(m[:, j], n_resamples=300, seed=9)
        assert (together[j].low, together[j].high) == pytest.approx((alone.low, alone.high), rel=1e-12)


def test_constant_scores_have_a_point_interval() -> None:
    ci = bootstrap_ci([0.25] * 30)
    assert (ci.low, ci.high) == pytest.approx((0.25, 0.25))


def test_paired_tests_on_identical_and_separated_systems() -> None:
    rng = np.random.default_rng(3)
    base = rng.uniform(0, 1, size=300)
    same = paired_bootstrap(base, base.copy(), n_resamples=500)
    assert same.delta == 0 and same.p_bootstrap == 1.0 and same.p_permutation == 1.0
    better = paired_bootstrap(base + 0.1 + rng.normal(0, 0.01, 300), base, n_resamples=500)
    assert better.delta == pytest.approx(0.1, abs=0.005)
    assert better.interval.low > 0 and better.p_bootstrap == better.p_permutation == 1 / 501


def test_paired_test_pairs_the_items_both_scored_by_id() -> None:
    rng = np.random.default_rng(4)
    a, b = rng.uniform(size=40), rng.uniform(size=40)
    ids = [f"q{i}" for i in range(40)]
    order = rng.permutation(40)
    a_scores: list[float | None] = [float(v) for v in a]
    a_scores[3] = None  # not scored by a
    test = paired_test(ids, a_scores, [ids[i] for i in order], [float(b[i]) for i in order], drop=["q7"],
                       n_resamples=300, seed=2)
    keep = [i for i in range(40) if i not in (3, 7)]
    assert test == paired_bootstrap(a[keep], b[keep], n_resamples=300, seed=2) and test.n == 38
    assert paired_test(range(3), [1.0, 2.0, 3.0], ["0", "1", "2"], [1.0, 2.0, 3.0]).delta == 0  # ids as strings
    with pytest.raises(NotComparable, match="no item scored for both"):
        paired_test(["x", "y"], [1.0, None], ["y", "z"], [1.0, 2.0])
    with pytest.raises(NotComparable, match="twice"):
        paired_test(["x", "x"], [1.0, 2.0], ["x"], [1.0])


def test_permutation_p_against_full_enumeration() -> None:
    diffs = np.array([0.3, -0.1, 0.25, 0.05, 0.2, -0.15, 0.1, 0.4, -0.05, 0.15])
    observed = abs(diffs.mean())
    flips = [abs(np.dot(signs, diffs)) / len(diffs) >= observed - 1e-12
             for signs in itertools.product((-1, 1), repeat=len(diffs))]
    exact = sum(flips) / len(flips)
    assert permutation_p(diffs, n_resamples=20000, seed=5) == pytest.approx(exact, abs=0.01)


def test_vectorised_corpus_bleu_mirrors_the_scalar_function() -> None:
    rng = np.random.default_rng(11)
    rows = []
    for _ in range(300):
        hyp, ref = int(rng.integers(0, 30)), int(rng.integers(1, 30))
        possible = [max(hyp - k, 0) for k in range(4)]
        matches = [int(rng.integers(0, p + 1)) for p in possible]
        rows.append(BleuStats(tuple(matches), tuple(possible), hyp, ref))
    for profile, overrides in [("mom", {}), ("crud", {}), ("mom", {"bleu_smoothing": "add1"})]:
        cfg = resolve_config(profile, **overrides)
        counts = np.array([[*s.matches, *s.possible, s.hyp_len, s.ref_len] for s in rows])
        b1, bavg = corpus_bleu_from_counts(counts, 4, cfg.bleu_smoothing, cfg.bleu_brevity_penalty)
        expected = np.array([bleu_from_stats(s, cfg) for s in rows])
        assert np.allclose(b1, expected[:, 0], rtol=1e-12, atol=1e-15)
        assert np.allclose(bavg, expected[:, 1], rtol=1e-9, atol=1e-15)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="empty"):
        bootstrap_ci([])
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ci([1.0, 2.0], confidence=95)
    with pytest.raises(ValueError, match="n_resamples must be at least 1"):
        paired_bootstrap([1.0, 2.0], [2.0, 1.0], n_resamples=0)
    with pytest.raises(ValueError, match="confidence must lie strictly between 0 and 1"):
        percentile_interval(np.array([0.1, 0.2]), 1.0, 2, seed=0)  # what score and the intrinsic measures call
    with pytest.raises(ValueError, match="align"):
        paired_bootstrap([1.0, 2.0], [1.0])
