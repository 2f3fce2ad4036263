"""Matching predicted chunk boundaries to gold ones: the one definition the segmentation scores
(:mod:`memreader.eval.segmentation`) and the cut head's fit (:mod:`memreader.training.cut_fit`) share.

    pairs = match_boundaries([120, 400], [118, 250, 402], tolerance=3)   # [(120, 118), (400, 402)]
    precision, recall, f1 = prf(len(pairs), 2, 3)
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["match_boundaries", "prf"]


def match_boundaries(predicted: Sequence[int], gold: Sequence[int], tolerance: int) -> list[tuple[int, int]]:
    """``(predicted, gold)`` pairs, one-to-one, at most ``tolerance`` apart, as many as possible.

    Both lists sorted: each gold boundary in order takes the earliest unmatched prediction within
    reach (predictions left behind can reach no later gold boundary).
    """
    pairs, j = [], 0
    for g in gold:
        while j < len(predicted) and predicted[j] < g - tolerance:
            j += 1
        if j < len(predicted) and predicted[j] <= g + tolerance:
            pairs.append((predicted[j], g))
            j += 1
    return pairs


def prf(matched: int, n_predicted: int, n_gold: int) -> tuple[float, float, float]:
    """Precision, recall, F1 from counts; no boundary on either side is a perfect 1, 1, 1."""
    if n_predicted == 0 and n_gold == 0:
        return 1.0, 1.0, 1.0
    precision = matched / n_predicted if n_predicted else 0.0
    recall = matched / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1
