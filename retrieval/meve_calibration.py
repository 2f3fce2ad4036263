"""Choosing MeVe's operating point by measurement: the tau (and budget) that meets a recall target with the fewest
context tokens, on questions whose supporting passages are known.

    cal = Calibrator(pipeline_for, questions, gold)          # gold: the supporting doc_ids of each question
    cal.add_scores("lm/content_free", scores)                 # per question, one score per phase-1 candidate
    points = [cal.point("lm/content_free", tau, t_max) for t_max in (512, 1024) for tau in tau_grid(scores)]
    best = choose(points, recall_target=top5_recalls)         # CalibrationError: no point meets it (closest named)

Phase 1 runs once per question (:meth:`memreader.retrieval.meve.MeVePipeline.candidates`); each point replays
phases 2-5 over copies of those candidates with the cached scores (:meth:`MeVePipeline.finish`), no model call.
:meth:`OperatingPoint.describe` is what ``operating_point`` records in every audit. Details: docs/MEVE.md
(Calibrated verifiers and the operating point, The shipped operating point).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from memreader.core.errors import MemReaderError
from memreader.retrieval.meve import Candidate, MeVePipeline

__all__ = ["CalibrationError", "Calibrator", "FixedScores", "OperatingPoint", "RememberingSource", "choose",
           "margin", "tau_grid"]


class CalibrationError(MemReaderError, ValueError):
    """No operating point meets the recall target (the message names the closest one), or the input is unusable."""


@dataclass(frozen=True)
class OperatingPoint:
    """One swept point and what it reached (means over the questions)."""

    verifier: str  # "<kind>/<calibration>", or "off" (verify=false)
    tau: float
    t_max: int
    recall: float
    tokens: float
    passages: float
    fallback_share: float
    n_questions: int
    per_question: tuple[float, ...] = ()  # each question's recall (for the paired test of :func:`choose`)
    budget_share: float = 0.0  # phase 5's budget is also at most this share of plain top-k's tokens (0: t_max alone)
    redundancy: float | None = None  # phase 4's threshold when the sweep set it (None: the pipeline's own)

    def settings(self) -> dict[str, Any]:
        """The MeVe keys of this point."""
        return _settings(self.verifier, self.tau, self.t_max, self.budget_share, self.redundancy)

    def describe(self, target: float | None = None, on: str = "") -> str:
        """One line: the point, what it reached, against which target, on which questions."""
        budget = f"budget_share={self.budget_share:g} (t_max={self.t_max})" if self.budget_share else f"t_max={self.t_max}"
        budget += f" redundancy={self.redundancy:g}" if self.redundancy is not None else ""
        line = (f"{self.verifier} tau={self.tau:.4g} {budget}: recall {self.recall:.3f}, "
                f"{self.tokens:.0f} tokens, {self.passages:.2f} passages, fallback {100 * self.fallback_share:.0f}% "
                f"over {self.n_questions} questions")
        if target is not None:
            line += f" (target recall >= {target:.3f})"
        return line + (f" on {on}" if on else "")


def _settings(verifier: str, tau: float, t_max: int, budget_share: float, redundancy: float | None) -> dict[str, Any]:
    """The MeVe keys of a point (``verifier`` "off": verify=false; ``redundancy`` None: the pipeline's own)."""
    budget: dict[str, Any] = {"t_max": t_max, "budget_share": budget_share}
    if redundancy is not None:
        budget["redundancy"] = redundancy
    if verifier == "off":
        return {"verify": False, **budget}
    kind, calibration = verifier.split("/")
    kind = kind.partition("@")[0]  # "cross_encoder@hotpotqa": the scores of the model that never saw hotpotqa
    return {"verify": True, "verifier_kind": kind, "verifier_calibration": calibration, "tau": tau, **budget}


class FixedScores:
    """A verifier that returns scores computed beforehand (one list per question, aligned with its candidates)."""

    def __init__(self, name: str, scores: dict[str, list[float]]) -> None:
        self.name, self.scores, self.seconds = name, scores, 0.0
        self.choice = {"stage": "verifier", "backend": "cached scores", "dtype": "-"}

    def score(self, question: str, passages: Sequence[str], similarities: Sequence[float] | None = None) -> list[float]:
        out = self.scores.get(question)
        if out is None or len(out) != len(passages):
            raise CalibrationError(f"no cached scores for {len(passages)} passages of question {question[:60]!r}")
        return list(out)


class RememberingSource:
    """A passage source that remembers its BM25 answers: a sweep replays the same fallback searches hundreds of
    times (kNN and vectors pass through; a replay reads neither)."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self._bm25: dict[tuple[str, int], list[Any]] = {}

    def knn(self, vector: Sequence[float], k: int) -> list[Any]:
        return self.source.knn(vector, k)

    def bm25(self, query: str, k: int) -> list[Any]:
        """The search's answer for (``query``, ``k``), searched once (not cut from a longer list: where scores tie at
        the limit, a search with another ``k`` may keep other passages)."""
        if (query, k) not in self._bm25:
            self._bm25[(query, k)] = self.source.bm25(query, k)
        return self._bm25[(query, k)]

    def vectors(self, ids: Sequence[str]) -> dict[str, Any]:
        return self.source.vectors(ids)


class Calibrator:
    """Phase-1 candidates of every question, cached verifier scores, and sweeps over them."""

    def __init__(self, pipeline_for: Callable[[dict[str, Any], Any], MeVePipeline], questions: Sequence[str],
                 gold: Sequence[set[str]]) -> None:
        """``pipeline_for(settings, verifier)``: a pipeline with those MeVe keys changed and that verifier."""
        if len(questions) != len(gold) or not questions:
            raise CalibrationError(f"{len(questions)} questions and {len(gold)} gold sets: give one set of "
                                   "supporting doc_ids per question, and at least one question")
        empty = [i for i, g in enumerate(gold) if not g]
        if empty:
            raise CalibrationError(f"question {empty[0]} has no supporting doc_ids: recall is undefined there",
                                   "leave such questions out of the calibration")
        self.pipeline_for, self.questions, self.gold = pipeline_for, list(questions), list(gold)
        probe = pipeline_for({"verify": False}, None)
        self.found: dict[str, list[Candidate]] = {q: probe.candidates(q) for q in self.questions}
        for found in self.found.values():  # counted once: every replay's packing reuses the counts
            for c, n in zip(found, probe.counter.counts([c.text for c in found]), strict=True):
                c.tokens = n
        self.scores: dict[str, dict[str, list[float]]] = {}

    def texts(self, question: str) -> list[str]:
        return [c.text for c in self.found[question]]

    def similarities(self, question: str) -> list[float]:
        return [c.similarity for c in self.found[question]]

    def add_scores(self, name: str, scores: dict[str, list[float]]) -> None:
        """Verifier ``name``'s scores per question, aligned with :attr:`found`."""
        bad = [q for q in self.questions if len(scores.get(q, ())) != len(self.found[q])]
        if bad:
            raise CalibrationError(f"{name}: scores missing or misaligned for {len(bad)} question(s), e.g. {bad[0]!r}")
        out_of_range = [x for q in self.questions for x in scores[q] if not 0.0 <= x <= 1.0]
        if out_of_range:
            raise CalibrationError(f"{name}: score {out_of_range[0]} outside [0, 1]")
        self.scores[name] = {q: list(scores[q]) for q in self.questions}

    def point(self, name: str, tau: float, t_max: int, budget_share: float = 0.0,
              redundancy: float | None = None) -> OperatingPoint:
        """Phases 2-5 at one setting over every question (``name`` "off": no verification; ``redundancy`` None: the
        pipeline's own)."""
        pipeline = self.pipeline_for(_settings(name, tau, t_max, budget_share, redundancy),
                                     None if name == "off" else FixedScores(name, self.scores[name]))
        recalls, tokens, passages, fallback = [], [], [], []
        for q, gold in zip(self.questions, self.gold, strict=True):
            result = pipeline.finish(q, [replace(c) for c in self.found[q]])
            recalls.append(len(gold & {p.doc_id for p in result.passages}) / len(gold))
            tokens.append(result.tokens)
            passages.append(len(result.passages))
            fallback.append(bool(result.audit["fallback"]["fired"]))
        mean = statistics.fmean
        return OperatingPoint(name, tau if name != "off" else 0.0, t_max, mean(recalls), mean(tokens), mean(passages),
                              mean(fallback), len(self.questions), tuple(recalls), budget_share, redundancy)


def tau_grid(scores: dict[str, list[float]], n: int = 24) -> list[float]:
    """Candidate taus: ``n`` quantiles of the observed scores (so the grid follows any verifier's scale), plus 0.5
    and 0 (keep everything)."""
    values = sorted(x for xs in scores.values() for x in xs)
    if not values:
        raise CalibrationError("no scores to place tau between")
    picks = {values[min(len(values) - 1, round(i * (len(values) - 1) / n))] for i in range(n + 1)}
    return sorted({0.0, 0.5, *(round(x, 6) for x in picks)})


def margin(point: OperatingPoint, target: float | Sequence[float], z: float) -> float:
    """How far ``point``'s recall stands above ``target`` after ``z`` standard errors: the mean paired difference
    minus z x its standard error when ``target`` is per question (a baseline's recalls on the same questions), else
    the mean recall minus z x its standard error minus ``target``. >= 0: the point meets the target."""
    if isinstance(target, (int, float)):
        diffs = [r - float(target) for r in point.per_question] or [point.recall - float(target)]
    else:
        if len(target) != len(point.per_question):
            raise CalibrationError(f"{len(target)} baseline recalls for {len(point.per_question)} questions")
        diffs = [r - b for r, b in zip(point.per_question, target, strict=True)]
    se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else 0.0
    return statistics.fmean(diffs) - z * se


def choose(points: Sequence[OperatingPoint], recall_target: float | Sequence[float], z: float = 1.0) -> OperatingPoint:
    """The point with the fewest tokens that meets the recall target with ``z`` standard errors to spare
    (:func:`margin`; ties: higher recall, then higher tau). The spare keeps a point chosen on a few dozen questions
    from sitting on the edge, where unseen questions fall below it half the time. ``recall_target``: one number,
    or a baseline's recall per question (paired: e.g. plain top-5's on the same questions). None meets it:
    :class:`CalibrationError` naming the closest point; nothing is chosen silently."""
    values = [recall_target] if isinstance(recall_target, (int, float)) else list(recall_target)
    bad = [v for v in values if not 0.0 <= v <= 1.0]
    if bad:
        raise CalibrationError(f"recall target {bad[0]} is outside [0, 1]", "give a share of supporting "
                               "passages, e.g. plain top-5's recall on the same questions")
    if not points:
        raise CalibrationError("no operating points to choose from")
    if z < 0:
        raise CalibrationError(f"z = {z} is negative", "give the standard errors to spare, e.g. 1")
    spare = {p: margin(p, recall_target, z) for p in points}
    meeting = [p for p in points if spare[p] >= -1e-12]
    if meeting:
        return min(meeting, key=lambda p: (p.tokens, -p.recall, -p.tau))
    closest = max(points, key=lambda p: (spare[p], -p.tokens))
    goal = statistics.fmean(values)
    raise CalibrationError(f"no operating point of {len(points)} reaches recall {goal:.3f} with {z:g} standard "
                           f"error(s) to spare; the closest is {closest.describe()} ({spare[closest]:+.3f} short)",
                           "lower the recall target, raise t_max (more passages fit), or try another verifier or "
                           "calibration")
