"""Cross-checks against independent implementations on Chinese CRUD-RAG-style pairs (``event`` as prediction,
``summary`` as reference), plus the mom/crud difference and the parallel path: by default on the 12 hand-written
records of tests/assets/, and opt-in (``-m slow``) on the 1,328 real ones in ../shared/datasets."""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import NamedTuple

import jieba
import pytest
from nltk.translate.bleu_score import modified_precision
from nltk.translate.meteor_score import meteor_score
from rouge_score import rouge_scorer
from sacrebleu.metrics import BLEU

from memreader.eval.metrics import PROFILES, resolve_config, score_example
from memreader.eval.score import score_examples


class JiebaTokenizer:
    """What HF ``evaluate`` hands rouge-score when the MoM / CRUD code passes ``tokenizer=f``."""

    def tokenize(self, text: str) -> list[str]:
        return list(jieba.cut(text))


def _ids(tokens: list[str], vocab: dict[str, str]) -> str:
    # sacrebleu splits on whitespace, but jieba emits whitespace tokens: give every token a
    # whitespace-free stand-in so sacrebleu sees exactly our token sequence.
    return " ".join(vocab.setdefault(t, f"t{len(vocab)}") for t in tokens)


class Expected(NamedTuple):
    """What a source of pairs must exercise, so that no comparison below passes on a wall of zeros."""

    pairs: int
    nonzero_bleu: int  # pairs with a nonzero 4-gram BLEU, at least
    shorter: int  # of the first 400 pairs, those with a shorter prediction and a nonzero BLEU, at least
    longer: int  # of the first 400 pairs, those with a prediction at least as long as its reference, at least


EXPECTED = {"assets": Expected(12, 11, 10, 1), "shared": Expected(1328, 1001, 101, 0)}


@pytest.fixture
def expected(request: pytest.FixtureRequest) -> Expected:
    return EXPECTED[request.node.callspec.params["crud_records"]]


@pytest.fixture(scope="module")
def mom_scores(zh_pairs: tuple[list[str], list[str]]) -> list:
    preds, refs = zh_pairs
    return [score_example(p, r, resolve_config("mom")) for p, r in zip(preds, refs, strict=True)]


def test_enough_pairs(zh_pairs: tuple[list[str], list[str]], expected: Expected) -> None:
    assert len(zh_pairs[0]) == len(zh_pairs[1]) == expected.pairs


def test_bleu_matches_sacrebleu_on_pretokenized_text(zh_pairs, mom_scores, expected) -> None:
    preds, refs = zh_pairs
    sacre = BLEU(tokenize="none", smooth_method="none", effective_order=False)
    crud_cfg = resolve_config("crud")
    nonzero = 0
    for pred, ref, ours in zip(preds, refs, mom_scores, strict=True):
        vocab: dict[str, str] = {}
        theirs = sacre.sentence_score(_ids(list(jieba.cut(pred)), vocab), [_ids(list(jieba.cut(ref)), vocab)])
        assert ours.bleu_1 == pytest.approx(theirs.precisions[0] / 100, rel=1e-12, abs=1e-15)
        assert ours.bleu_avg == pytest.approx(theirs.score / 100, rel=1e-9, abs=1e-15)
        crud = score_example(pred, ref, crud_cfg).bleu_avg
        assert crud == pytest.approx(theirs.score / 100 / theirs.bp if theirs.bp else 0.0, rel=1e-9, abs=1e-15)
        nonzero += ours.bleu_avg > 0
    assert nonzero >= expected.nonzero_bleu  # the comparison exercises 4-gram matches, not a wall of zeros


def test_bleu_1_equals_nltk_modified_precision_exactly(zh_pairs, mom_scores) -> None:
    preds, refs = zh_pairs
    for pred, ref, ours in zip(preds, refs, mom_scores, strict=True):
        p1: Fraction = modified_precision([list(jieba.cut(ref))], list(jieba.cut(pred)), 1)
        assert ours.bleu_1 == float(p1)


def test_rouge_l_equals_rouge_score_exactly(zh_pairs, crud_records, mom_scores) -> None:
    scorer = rouge_scorer.RougeScorer(["rougeL"], tokenizer=JiebaTokenizer())
    preds, refs = zh_pairs
    for pred, ref, ours in zip(preds, refs, mom_scores, strict=True):
        assert ours.rouge_l == scorer.score(ref, pred)["rougeL"].fmeasure
    # longer pairs too (article leads against summaries), where the LCS table is large
    cfg = resolve_config("mom", meteor_wordnet=False)
    for r in crud_records[:100]:
        lead, summary = r["text"][:250], r["summary"]
        assert score_example(lead, summary, cfg).rouge_l == scorer.score(summary, lead)["rougeL"].fmeasure


def test_meteor_equals_the_mom_notebook_cell(zh_pairs, mom_scores) -> None:
    def preprocess_text(text: str) -> list[str]:  # the MoM notebook's METEOR preprocessing
        return " ".join(jieba.cut(text)).split()

    preds, refs = zh_pairs
    for pred, ref, ours in zip(preds, refs, mom_scores, strict=True):
        assert ours.meteor == meteor_score([preprocess_text(ref)], preprocess_text(pred))


def test_profiles_differ_exactly_where_the_evaluators_do(zh_pairs, mom_scores, expected) -> None:
    mom, crud = dataclasses.asdict(PROFILES["mom"]), dataclasses.asdict(PROFILES["crud"])
    assert {k for k in mom if mom[k] != crud[k]} == {"bleu_brevity_penalty", "empty"}
    preds, refs = zh_pairs
    crud_cfg = resolve_config("crud")
    shorter = longer = 0
    for pred, ref, m in zip(preds[:400], refs[:400], mom_scores[:400], strict=True):
        c = score_example(pred, ref, crud_cfg)
        assert (c.bleu_1, c.rouge_l, c.meteor) == (m.bleu_1, m.rouge_l, m.meteor)
        if m.bleu_stats.hyp_len < m.bleu_stats.ref_len and m.bleu_avg > 0:
            assert c.bleu_avg > m.bleu_avg
            shorter += 1
        elif m.bleu_stats.hyp_len >= m.bleu_stats.ref_len:
            assert c.bleu_avg == m.bleu_avg
            longer += 1
    assert shorter >= expected.shorter  # events are shorter than summaries, so the penalty matters here
    assert longer >= expected.longer  # ... and where it does not, both profiles agree


def test_parallel_equals_serial(zh_pairs, mom_scores) -> None:
    preds, refs = zh_pairs
    parallel = score_examples(preds[:300], refs[:300], resolve_config("mom"), workers=2)
    assert parallel == mom_scores[:300]


@pytest.mark.heavy
def test_parallel_workers_read_their_own_wordnet_files() -> None:
    """Forked workers inherit the parent's open WordNet data files and with them one shared file offset: two workers
    seeking and reading data.adj at once read each other's lines (a wrong synset, or an AttributeError inside nltk;
    met on the full MultiFieldQA-zh run). Many distinct adjectives, no exact matches, so every hypothesis word is
    looked up in data.adj by both workers at the same time; before the fix this failed on every try."""
    import random

    from nltk.corpus import wordnet

    from memreader.eval import metrics

    config = resolve_config("mom")
    metrics.prepare(config)  # opens data.adj in this process (WordNet's version), as `memreader eval` does
    words = sorted(w for w in wordnet.all_lemma_names("a") if w.isalpha())
    random.Random(0).shuffle(words)
    preds = [" ".join(words[i : i + 20]) for i in range(0, 2000, 20)]
    refs = [" ".join(words[i : i + 20]) for i in range(2000, 4000, 20)]
    # parallel first: nltk caches every synset it has read, and forked workers would inherit that cache
    parallel = [score_examples(preds, refs, config, workers=2) for _ in range(2)]
    serial = score_examples(preds, refs, config, workers=1)
    assert len(metrics._scorers(config).wordnet._cache) >= 1900  # every hypothesis word was looked up in WordNet
    assert parallel == [serial, serial]


def test_reopen_wordnet_files_closes_this_process_copies() -> None:
    from nltk.corpus import wordnet

    from memreader.eval import metrics

    metrics.prepare(resolve_config("mom"))
    wordnet.synsets("two")  # a satellite adjective: reads data.adj and data.noun
    handles = list(wordnet._data_file_map.values())
    assert handles
    metrics.reopen_wordnet_files()
    assert wordnet._data_file_map == {} and all(h.closed for h in handles)
    assert "two.s.01" in [s.name() for s in wordnet.synsets("two")]  # opened again on the next lookup
