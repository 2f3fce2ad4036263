"""MoM candidate selection: rank the candidates of one document per metric, fuse with RRF, keep the best.

    rows = select_candidates([{"clarity": 0.61, "completeness": 0.08}, {"clarity": 0.70, "completeness": 0.05}])
    winner = next(r for r in rows if r["selected"])

Details (ranks, ties, missing scores, ``k``): docs/ARCHITECTURE.md (Selection).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from memreader.core.errors import MemReaderError
from memreader.core.fusion import RRF_K, reciprocal_rank_fusion, rrf_k_problem

METRICS = ("clarity", "completeness")


class SelectionError(MemReaderError, ValueError):
    """Candidate selection cannot run with these settings or scores."""


def metric_ranks(values: Sequence[float | None]) -> list[int]:
    """1-based descending ranks; ties by index (earlier first); ``None`` after every number."""
    for v in values:
        if v is not None and not math.isfinite(v):
            raise SelectionError(f"a candidate score is {v!r}; scores must be finite numbers or None",
                                 "rescore the candidates (the scorer never writes NaN: this file was edited)")
    order = sorted(range(len(values)), key=lambda i: (values[i] is None, -(values[i] or 0.0), i))
    ranks = [0] * len(values)
    for rank, i in enumerate(order, start=1):
        ranks[i] = rank
    return ranks


def select_candidates(scores: Sequence[Mapping[str, Any]], k: float = RRF_K) -> list[dict[str, Any]]:
    """Rank and fuse one document's candidates; returns one row per candidate (input order) with
    ``rank_clarity``, ``rank_completeness`` (None when no candidate has that metric), ``rrf`` and
    ``selected`` (exactly one True)."""
    problem = rrf_k_problem(k)
    if problem:
        raise SelectionError(problem, f"set rrf_k={RRF_K:g}, the value of MoM and of the RRF paper")
    if not scores:
        raise SelectionError("no candidate to select from", "generate at least one usable candidate (num_candidates >= 1)")
    rows = [dict(s) for s in scores]
    rankings = []
    for metric in METRICS:
        values = [r.get(metric) for r in rows]
        if all(v is None for v in values):
            for r in rows:
                r[f"rank_{metric}"] = None
            continue
        ranks = metric_ranks(values)
        for r, rank in zip(rows, ranks, strict=True):
            r[f"rank_{metric}"] = rank
        rankings.append(sorted(range(len(rows)), key=lambda i, ranks=ranks: ranks[i]))
    if not rankings:
        raise SelectionError("no candidate has a clarity or completeness score", "score the candidates first")
    fused = reciprocal_rank_fusion(rankings, k=k)
    for i, rrf in fused:
        rows[i]["rrf"] = rrf
    winner = fused[0][0]
    for i, r in enumerate(rows):
        r["selected"] = i == winner
    return rows
