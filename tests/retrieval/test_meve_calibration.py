"""Calibrated MeVe verifiers and the operating-point search: content-free and per-question calibration do what
their formulas say, the embedding verifier uses phase 1's cosines inside a real pipeline, packing that tokenises
once gives the exact walk's result, and a calibration that cannot meet its target names the closest point."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest

from memreader.retrieval.meve import PAPER_SETTINGS, MeVePipeline, MeVeSettings
from memreader.retrieval.meve_calibration import (
    CalibrationError,
    Calibrator,
    OperatingPoint,
    RememberingSource,
    choose,
    margin,
    tau_grid,
)
from memreader.retrieval.verifier import VerifierError
from memreader.retrieval.verifier_calibration import (
    CONTENT_FREE,
    CalibratedVerifier,
    EmbeddingVerifier,
    build_meve_verifier,
    calibrate,
)
from tests.retrieval.retrieval_samples import QUESTION


def _sig(z: float) -> float:
    return 1 / (1 + math.exp(-z))


class RawVerifier:
    """Raw margins from a table (the content-free passage included), to check the calibration arithmetic."""

    name = "raw"

    def __init__(self, raw: dict[str, float]) -> None:
        self.raw, self.seconds, self.seen = raw, 0.0, []

    def margins(self, question: str, passages: Sequence[str]) -> list[float]:
        self.seen.append(list(passages))
        return [self.raw[p] for p in passages]

    def score(self, question: str, passages: Sequence[str]) -> list[float]:
        return [_sig(m) for m in self.margins(question, passages)]


def test_content_free_subtracts_the_empty_passage_reading() -> None:
    inner = RawVerifier({"a": -2.0, "b": -3.5, CONTENT_FREE: -3.0})
    scores = CalibratedVerifier(inner, "content_free").score("q?", ["a", "b"])
    assert scores == pytest.approx([_sig(1.0), _sig(-0.5)])
    assert inner.seen == [["a", "b", CONTENT_FREE]]  # one call: the content-free passage rides along
    # uncalibrated, both are "no" (below 0.5); calibrated, "a" helps more than no passage at all
    assert all(s < 0.5 for s in inner.score("q?", ["a", "b"])) and scores[0] > 0.5


def test_query_calibration_ignores_the_verifier_scale() -> None:
    raw = {"a": 1.0, "b": 2.0, "c": 4.0}
    shifted = {k: 3 * v - 7 for k, v in raw.items()}  # another scale and bias, same order and spacing
    one = CalibratedVerifier(RawVerifier(raw), "query").score("q?", list(raw))
    two = CalibratedVerifier(RawVerifier(shifted), "query").score("q?", list(raw))
    assert one == pytest.approx(two)
    mean, std = 7 / 3, math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 3)
    assert one == pytest.approx([_sig((x - mean) / std) for x in raw.values()])


def test_embedding_verifier_and_bad_calibrations() -> None:
    v = EmbeddingVerifier()
    assert v.score("q?", ["x", "y"], similarities=[0.7, -0.2]) == [0.7, 0.0]
    with pytest.raises(VerifierError, match="given no similarities"):
        v.score("q?", ["x"])
    with pytest.raises(VerifierError, match="content-free reading"):
        calibrate(EmbeddingVerifier(), "content_free")
    with pytest.raises(VerifierError, match="is not one of"):
        calibrate(RawVerifier({}), "platt")
    assert calibrate(RawVerifier({}), "none").name == "raw"  # none leaves an LM verifier as it is


@pytest.mark.integration
def test_embedding_verifier_keeps_what_phase_one_found_close(store, embedder, tokenizer) -> None:
    settings = MeVeSettings(k=5, tau=0.5, verifier_kind="embedding", verifier_calibration="none", n_min=0,
                            operating_point="test point")
    verifier = build_meve_verifier("embedding", "", "none")
    result = MeVePipeline(store, embedder, verifier, tokenizer, settings).run(QUESTION)
    candidates = result.audit["knn"]["candidates"]
    kept = {c["id"] for c in result.audit["verify"]["kept"]}
    assert kept == {c["id"] for c in candidates if c["similarity"] >= 0.5} and kept
    assert {c["id"]: c["verifier_score"] for c in result.audit["verify"]["kept"]} == {
        c["id"]: pytest.approx(c["similarity"], abs=1e-6) for c in candidates if c["id"] in kept}
    assert result.audit["operating_point"] == "test point" and result.audit["ms"]["verifier"] < 50
    assert "verifier:embedding:" in result.audit["signature"] and not result.audit["fallback"]["fired"]


@pytest.mark.integration
def test_packing_tokenises_once_and_matches_the_exact_walk(store, embedder, tokenizer) -> None:
    for t_max in (20, 40, 45, 60, 90, 130):
        pipeline = MeVePipeline(store, embedder, None, tokenizer, MeVeSettings(k=7, verify=False, t_max=t_max))
        ordered = pipeline.candidates(QUESTION)
        for c in ordered:
            c.tokens = len(tokenizer(c.text, add_special_tokens=False)["input_ids"])
        quick, exact = pipeline._fit(ordered), pipeline._fit(ordered, exact=True)
        assert [c.id for c in quick[0]] == [c.id for c in exact[0]], t_max
        result = pipeline.run(QUESTION)
        assert result.tokens <= t_max and result.tokens == len(tokenizer(result.context, add_special_tokens=False)
                                                               ["input_ids"])


@pytest.mark.integration
def test_a_sweep_chooses_the_fewest_tokens_that_meet_recall(store, embedder, tokenizer) -> None:
    def pipeline_for(keys: dict[str, Any], verifier: Any) -> MeVePipeline:
        return MeVePipeline(store, embedder, verifier, tokenizer, MeVeSettings(**{**PAPER_SETTINGS, "k": 7, "n_min": 0, **keys}))

    questions = [QUESTION, "How long should green tea steep?"]
    gold = [{"Kettles"}, {"Steeping"}]  # (the two green-tea passages are near copies: one is dropped as redundant)
    cal = Calibrator(pipeline_for, questions, gold)
    cal.add_scores("embedding/none", {q: [max(0.0, s) for s in cal.similarities(q)] for q in questions})
    points = [cal.point("embedding/none", tau, t) for t in (60, 400) for tau in tau_grid(cal.scores["embedding/none"], n=8)]
    chosen = choose(points, 1.0, z=0.0)
    assert chosen.recall == 1.0 and chosen.tokens == min(p.tokens for p in points if p.recall == 1.0)
    assert chosen.settings()["verifier_kind"] == "embedding" and "tau=" in chosen.describe(1.0, "2 questions")
    with pytest.raises(CalibrationError, match="misaligned"):
        cal.add_scores("lm/none", {questions[0]: [0.5]})


@pytest.mark.integration
def test_a_sweep_over_shares_and_redundancy_replays_bm25_from_memory(store, embedder, tokenizer) -> None:
    searched: list[tuple[str, int]] = []

    class Counting:
        token_key = None

        def knn(self, vector, k):
            return store.knn(vector, k)

        def bm25(self, query, k):
            searched.append((query, k))
            return store.bm25(query, k)

        def vectors(self, ids):
            return store.vectors(ids)

    source = RememberingSource(Counting())
    assert source.bm25(QUESTION, 2) == store.bm25(QUESTION, 2) and source.bm25(QUESTION, 5) == store.bm25(QUESTION, 5)
    assert source.bm25(QUESTION, 2) == store.bm25(QUESTION, 2) and searched == [(QUESTION, 2), (QUESTION, 5)]

    def pipeline_for(keys: dict[str, Any], verifier: Any) -> MeVePipeline:
        return MeVePipeline(source, embedder, verifier, tokenizer, MeVeSettings(**{**PAPER_SETTINGS, "k": 7, "n_min": 3, **keys}))

    cal = Calibrator(pipeline_for, [QUESTION], [{"Kettles"}])
    cal.add_scores("embedding/none", {QUESTION: [0.0] * len(cal.found[QUESTION])})  # nothing kept: BM25 fills in
    before = len(searched)
    points = [cal.point("embedding/none", 0.5, 4000, share) for share in (0.2, 0.6)]
    again = [cal.point("embedding/none", 0.5, 4000, 0.6, redundancy=r) for r in (0.5, 1.0)]
    assert len(searched) - before <= 2  # a search per (question, k) the fallback asks, every later replay from memory
    assert points[0].tokens < points[1].tokens and points[1].budget_share == 0.6
    assert again[0].passages <= again[1].passages  # a lower threshold drops more near copies
    assert again[0].settings() == {"verify": True, "verifier_kind": "embedding", "verifier_calibration": "none",
                                   "tau": 0.5, "t_max": 4000, "budget_share": 0.6, "redundancy": 0.5}
    assert "budget_share=0.6 (t_max=4000) redundancy=0.5" in again[0].describe()


def _point(tokens: float, recalls: tuple[float, ...], tau: float = 0.5) -> OperatingPoint:
    return OperatingPoint("lm/query", tau, 512, sum(recalls) / len(recalls), tokens, 4.0, 0.0, len(recalls), recalls)


def test_choose_keeps_a_margin_and_names_the_closest_point() -> None:
    baseline = [1.0, 0.5, 0.5, 1.0]
    edge = _point(300, (1.0, 0.5, 1.0, 0.5))  # the baseline's mean, won on one question, lost on another
    better = _point(450, (1.0, 1.0, 1.0, 1.0))
    assert choose([edge, better], baseline, z=0.0) == edge
    assert margin(better, baseline, 1.0) > 0 and choose([edge, better], baseline, z=1.0) == better
    with pytest.raises(CalibrationError) as err:
        choose([edge], [1.0, 1.0, 1.0, 1.0], z=1.0)
    assert "the closest is lm/query tau=0.5 t_max=512: recall 0.750, 300 tokens" in str(err.value)
    assert "short" in str(err.value) and "raise t_max" in str(err.value)
    with pytest.raises(CalibrationError, match=r"outside \[0, 1\]"):
        choose([edge], 1.5)
    with pytest.raises(CalibrationError, match="negative"):
        choose([edge], 0.5, z=-1)
