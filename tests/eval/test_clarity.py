"""Clarity per memory (None without a boundary) and its correlation with ROUGE-L on hand-made tables."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats as sps

from memreader.core.schema import DocumentMemory, Scenario
from memreader.eval.intrinsic import CorrelationError, MethodRow, chunk_scores, clarity_signature, correlate
from memreader.eval.records import ClarityRecord

# Hand-made table: 4 methods, 6 questions, 4 documents (one method has a single-chunk document).
# Method means: clarity x = 0.1, 0.2, 0.3, 0.6; ROUGE-L y = 0.2, 0.25, 0.5, 0.55.
# By hand: dx = (-.2, -.1, 0, .3), dy = (-.175, -.125, .125, .175); sum dx*dy = 0.1,
# sum dx^2 = 0.14, sum dy^2 = 0.0925, so r = 0.1 / sqrt(0.14 * 0.0925); the ranks agree, so rho = 1.
ROWS = [
    MethodRow("fixed", [0.1, 0.3, 0.2, 0.2, 0.0, 0.4], [0.1, 0.0, 0.2, 0.1]),
    MethodRow("semantic", [0.25, 0.25, 0.5, 0.0, 0.2, 0.3], [0.2, None, 0.3, 0.1]),
    MethodRow("llm", [0.5, 0.6, 0.4, 0.5, 0.7, 0.3], [0.3, 0.3, 0.2, 0.4]),
    MethodRow("memreader", [0.55, 0.65, 0.45, 0.5, 0.75, 0.4], [0.6, 0.7, 0.5, 0.6]),
]
HAND_PEARSON = 0.1 / math.sqrt(0.14 * 0.0925)


def test_correlation_on_hand_made_table():
    corr = correlate(ROWS, n_resamples=500, seed=7)
    assert corr.clarity_means == pytest.approx([0.1, 0.2, 0.3, 0.6])
    assert corr.rouge_means == pytest.approx([0.2, 0.25, 0.5, 0.55])
    assert corr.pearson == pytest.approx(HAND_PEARSON, abs=1e-12)
    assert corr.pearson == pytest.approx(sps.pearsonr(corr.clarity_means, corr.rouge_means).statistic, abs=1e-12)
    assert corr.spearman == pytest.approx(1.0)
    for value, interval in ((corr.pearson, corr.pearson_interval), (corr.spearman, corr.spearman_interval)):
        assert interval is not None and interval.low <= value <= interval.high
        assert interval.n_resamples == 500 and interval.seed == 7
    assert corr.pearson_interval.low < corr.pearson_interval.high  # the draws do vary
    again = correlate(ROWS, n_resamples=500, seed=7)
    assert again.to_dict() == corr.to_dict()  # reproducible by seed
    assert correlate(ROWS, n_resamples=500, seed=8).pearson_interval != corr.pearson_interval
    assert "questions (n=6" in corr.resampled and "documents (n=4" in corr.resampled


def test_bootstrap_recomputes_means_per_draw():
    # Anti-monotone table: rho = -1 exactly; reversing ROUGE-L flips the sign of r.
    rows = [MethodRow(r.method, r.rouge_l[::-1], r.clarity) for r in ROWS]
    flipped = [MethodRow(r.method, [1 - v for v in r.rouge_l], r.clarity) for r in ROWS]
    assert correlate(rows, 50).pearson == pytest.approx(HAND_PEARSON)  # means do not depend on order
    corr = correlate(flipped, 200, seed=3)
    assert corr.pearson == pytest.approx(-HAND_PEARSON) and corr.spearman == pytest.approx(-1.0)
    assert corr.pearson_interval.high < 0  # the whole interval on the negative side
    assert corr.pearson_interval.low <= corr.pearson <= corr.pearson_interval.high


def test_spearman_differs_from_pearson_and_matches_scipy():
    rows = [MethodRow("a", [0.1], [0.1]), MethodRow("b", [0.3], [0.2]), MethodRow("c", [0.2], [0.9]),
            MethodRow("d", [0.4], [0.3])]
    corr = correlate(rows, n_resamples=20)
    x, y = [0.1, 0.2, 0.9, 0.3], [0.1, 0.3, 0.2, 0.4]
    assert corr.spearman == pytest.approx(sps.spearmanr(x, y).statistic)
    assert corr.pearson == pytest.approx(sps.pearsonr(x, y).statistic)
    # one question and one document: every draw is the data itself
    assert corr.pearson_interval.low == pytest.approx(corr.pearson_interval.high)


def test_too_few_methods_and_misaligned_rows():
    with pytest.raises(CorrelationError, match="at least 3 methods"):
        correlate(ROWS[:2])
    with pytest.raises(CorrelationError, match="aligned"):
        correlate([*ROWS[:2], MethodRow("x", [0.1], [0.2, 0.3, 0.1, 0.1])])
    with pytest.raises(CorrelationError, match="boundary"):
        correlate([*ROWS[:2], MethodRow("x", [0.1] * 6, [None] * 4)])


# -- chunk_scores with the real evaluator scorer on a tiny random model


def _memory(doc_id: str, chunks: list[str]) -> DocumentMemory:
    scenarios, pos = [], 0
    for text in chunks:
        scenarios.append(Scenario("", "", pos, pos + len(text)))
        pos += len(text)
    mem = DocumentMemory(doc_id, "".join(chunks), scenarios)
    mem.validate()
    return mem


@pytest.fixture(scope="module")
def scorer(smollm2_tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    from memreader.core.scoring import EvaluatorScorer, ScorerSettings

    tok = smollm2_tokenizer
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=True, initializer_range=0.4, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    return EvaluatorScorer(ScorerSettings(), model=LlamaForCausalLM(config).eval(), tokenizer=tok)


@pytest.mark.integration
def test_chunk_clarity_uses_the_scorer_and_marks_single_chunks(scorer):
    memories = [_memory("a", ["The cat sat on the mat. ", "Stock markets fell on Monday. ", "It rained."]),
                _memory("b", ["Only one chunk here."]),
                _memory("c", ["厦门大学位于福建省。", "它创办于1921年。"])]
    values = [None if s.single_chunk else float(s.clarity) for s in chunk_scores(scorer, memories, block=2)]
    direct = scorer.score(memories)
    assert values[1] is None and direct[1].single_chunk
    assert values[0] == pytest.approx(float(np.mean(direct[0].boundaries)))
    assert values[2] == pytest.approx(direct[2].clarity)
    summary = ClarityRecord.of(values, [m.doc_id for m in memories], clarity_signature(scorer)).to_dict()
    assert summary["n_single_chunk"] == 1 and summary["doc_ids"] == ["a", "b", "c"]
    assert summary["mean"] == pytest.approx((values[0] + values[2]) / 2)
    assert summary["signature"].startswith("Clarity|variant:ppl|")
