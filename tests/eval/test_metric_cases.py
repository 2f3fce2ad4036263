"""Hand-checked scores: every expected value below is derived by hand from the tokens in the comment.

Notation: p_n = clipped n-gram precision, BP = exp(1 - ref_len / hyp_len) when the hypothesis is
shorter; METEOR = Fmean * (1 - 0.5 * (chunks / matches) ** 3) with
Fmean = P * R / (0.9 * P + 0.1 * R).
"""

from __future__ import annotations

import math

import pytest

from memreader.eval.metrics import METRICS, MetricConfig, corpus_bleu, resolve_config, score_example
from memreader.eval.tokenize import tokenize


def scores(example: object) -> dict[str, float]:
    """The four scores of an example by metric name."""
    return {name: getattr(example, name) for name in METRICS}


def meteor(p: float, r: float, chunks: int, matches: int) -> float:
    """The METEOR formula with alpha 0.9, beta 3, gamma 0.5."""
    return p * r / (0.9 * p + 0.1 * r) * (1 - 0.5 * (chunks / matches) ** 3)


# (case, prediction, reference, BLEU-1, BLEU-Avg mom, BLEU-Avg crud, ROUGE-L, METEOR)
CHINESE = [
    # 我/爱/北京/天安门 twice: every precision 1, one chunk of 4 matches.
    ("identical", "我爱北京天安门", "我爱北京天安门", 1.0, 1.0, 1.0, 1.0, meteor(1, 1, 1, 4)),
    # 今天天气/很/好/。 (4) vs the same + 明天/下雨 (6): p1..p4 = 1, BP = exp(1 - 6/4); crud divides BP out.
    ("shorter", "今天天气很好。", "今天天气很好。明天下雨", 1.0, math.exp(-0.5), 1.0, 0.8, meteor(1, 4 / 6, 1, 4)),
    # The other way round: p = 4/6, 3/5, 2/4, 1/3, BP = 1, so both profiles agree.
    ("longer", "今天天气很好。明天下雨", "今天天气很好。", 4 / 6, (1 / 15) ** 0.25, (1 / 15) ** 0.25, 0.8,
     meteor(4 / 6, 1, 1, 4)),
    # 明天/下雨 vs 学生/们/在/学习: nothing shared.
    ("no overlap", "明天下雨", "学生们在学习", 0.0, 0.0, 0.0, 0.0, 0.0),
    # 北京 x3 vs 北京/欢迎/你: unigram clipped to 1 of 3; no shared bigram.
    ("clipping", "北京北京北京", "北京欢迎你", 1 / 3, 0.0, 0.0, 1 / 3, meteor(1 / 3, 1 / 3, 1, 1)),
    # 我/爱/北京 vs 我/爱/" "/北京: the space is a BLEU/ROUGE token (p2 = 1/2, p3 = 0) but METEOR drops it.
    ("whitespace token", "我爱北京", "我爱 北京", 1.0, 0.0, 0.0, 6 / 7, meteor(1, 1, 1, 3)),
    # 厦门大学/。 vs 厦门大学/举办/。: punctuation is a token; the two matches are two chunks.
    ("punctuation", "厦门大学。", "厦门大学举办。", 1.0, 0.0, 0.0, 0.8, meteor(1, 2 / 3, 2, 2)),
    # 我/爱/北京 (3 tokens) has no 4-gram, so p4 = 0 and BLEU-Avg is 0 without smoothing.
    ("too short for 4-grams", "我爱北京", "我爱北京天安门", 1.0, 0.0, 0.0, 6 / 7, meteor(1, 3 / 4, 1, 3)),
    ("empty prediction", "", "北京欢迎你", 0.0, 0.0, 0.0, 0.0, 0.0),
    ("empty reference", "北京欢迎你", "", 0.0, 0.0, 0.0, 0.0, 0.0),
    ("blank prediction", "  \n", "北京欢迎你", 0.0, 0.0, 0.0, 0.0, 0.0),
]

ENGLISH = [
    ("identical", "the cat sat on the mat", "the cat sat on the mat", 1.0, 1.0, 1.0, 1.0, meteor(1, 1, 1, 6)),
    ("no overlap", "sunny weather today", "quarterly revenue fell", 0.0, 0.0, 0.0, 0.0, 0.0),
    # the x4 vs the/cat: p1 = 1/4 (clipped), LCS 1 -> F = 2 * 1/4 * 1/2 / (3/4).
    ("clipping", "the the the the", "the cat", 0.25, 0.0, 0.0, 1 / 3, meteor(1 / 4, 1 / 2, 1, 1)),
    # 4 vs 8 tokens, a perfect prefix: BP = exp(1 - 8/4) = 1/e.
    ("shorter", "a b c d", "a b c d e f g h", 1.0, math.exp(-1), 1.0, 2 / 3, meteor(1, 1 / 2, 1, 4)),
    # 8 vs 4: p = 4/8, 3/7, 2/6, 1/5, BP = 1.
    ("longer", "a b c d e f g h", "a b c d", 0.5, (1 / 70) ** 0.25, (1 / 70) ** 0.25, 2 / 3, meteor(1 / 2, 1, 1, 4)),
    # Porter stems dogs -> dog: METEOR matches both words in one chunk; BLEU and ROUGE-L do not.
    ("stem match", "big dogs", "big dog", 0.5, 0.0, 0.0, 0.5, meteor(1, 1, 1, 2)),
    ("empty prediction", "", "the cat", 0.0, 0.0, 0.0, 0.0, 0.0),
]


def _check(case: tuple, config_mom: MetricConfig, config_crud: MetricConfig) -> None:
    name, pred, ref, b1, bavg_mom, bavg_crud, rouge, met = case
    mom = score_example(pred, ref, config_mom)
    crud = score_example(pred, ref, config_crud)
    expected = {"bleu_1": b1, "bleu_avg": bavg_mom, "rouge_l": rouge, "meteor": met}
    assert scores(mom) == pytest.approx(expected, rel=1e-12, abs=1e-15), name
    assert scores(crud) == pytest.approx({**expected, "bleu_avg": bavg_crud}, rel=1e-12, abs=1e-15), name


@pytest.mark.parametrize("case", CHINESE, ids=[c[0] for c in CHINESE])
def test_chinese_cases(case: tuple) -> None:
    _check(case, resolve_config("mom"), resolve_config("crud"))


@pytest.mark.parametrize("case", ENGLISH, ids=[c[0] for c in ENGLISH])
def test_english_cases(case: tuple) -> None:
    _check(case, resolve_config("mom", tokenizer="whitespace"), resolve_config("crud", tokenizer="whitespace"))


def test_jieba_tokens_behind_the_chinese_table() -> None:
    assert tokenize("今天天气很好。明天下雨", "jieba") == ["今天天气", "很", "好", "。", "明天", "下雨"]
    assert tokenize("我爱 北京", "jieba") == ["我", "爱", " ", "北京"]
    assert tokenize("北京北京北京", "jieba") == ["北京"] * 3
    assert tokenize("厦门大学举办。", "jieba") == ["厦门大学", "举办", "。"]


def test_other_tokenizers() -> None:
    assert tokenize("It's a test.", "13a") == ["It's", "a", "test", "."]
    assert tokenize("北京 欢迎", "char") == ["北", "京", " ", "欢", "迎"]
    assert tokenize(" a  b\n", "whitespace") == ["a", "b"]
    with pytest.raises(ValueError, match="unknown tokenizer 'spacy'"):
        tokenize("x", "spacy")


def test_wordnet_synonyms_on_and_off() -> None:
    # WordNet lists "hound" among the lemmas of a synset of "dog": two matches in one chunk.
    on = score_example("big dog", "big hound", resolve_config("mom", tokenizer="whitespace"))
    off = score_example("big dog", "big hound", resolve_config("mom", tokenizer="whitespace", meteor_wordnet=False))
    assert on.meteor == pytest.approx(meteor(1, 1, 1, 2), rel=1e-12)
    assert off.meteor == pytest.approx(meteor(1 / 2, 1 / 2, 1, 1), rel=1e-12)


def test_case_folding_is_explicit() -> None:
    mixed = score_example("The Cat", "the cat", resolve_config("mom", tokenizer="whitespace"))
    folded = score_example("The Cat", "the cat", resolve_config("mom", tokenizer="whitespace", lowercase=True,
                                                                bleu_max_order=2))
    # nltk's METEOR lower-cases on its own (meteor_lowercase=True); BLEU/ROUGE-L only when asked.
    assert (mixed.bleu_1, mixed.rouge_l, mixed.meteor) == (0.0, 0.0, pytest.approx(meteor(1, 1, 1, 2)))
    assert (folded.bleu_1, folded.bleu_avg, folded.rouge_l) == (1.0, 1.0, 1.0)


def test_add_one_smoothing() -> None:
    # the x4 vs the/cat: (1+1)/(4+1), (0+1)/(3+1), 1/(2+1), 1/(1+1); BLEU-1 is smoothed too.
    s = score_example("the the the the", "the cat", resolve_config("mom", tokenizer="whitespace", bleu_smoothing="add1"))
    assert s.bleu_1 == pytest.approx(0.4)
    assert s.bleu_avg == pytest.approx((0.4 * 0.25 / 3 * 0.5) ** 0.25, rel=1e-12)


def test_corpus_level_pools_counts() -> None:
    cfg = resolve_config("mom", tokenizer="whitespace", bleu_level="corpus", multi_ref="first")
    scores = [score_example("a b c d", "a b c d e f g h", cfg), score_example("a b c d e f g h", "a b c d", cfg)]
    # matches 8/12, 6/10, 4/8, 2/6 and lengths 12 vs 12 (BP 1) once pooled.
    assert corpus_bleu(scores, cfg) == pytest.approx((8 / 12, (1 / 15) ** 0.25), rel=1e-12)


def test_multiple_references() -> None:
    refs = ["a b x y", "c d z w"]
    def b1(policy: str) -> float:
        return score_example("a b c d", refs, resolve_config("mom", tokenizer="whitespace", multi_ref=policy)).bleu_1
    # native clips against the union of both references' counts (nmt-BLEU); max/first score each alone.
    assert (b1("native"), b1("max"), b1("first")) == (1.0, 0.5, 0.5)
    best = score_example("a b c d", ["x", "a b c d"], resolve_config("mom", tokenizer="whitespace"))
    assert scores(best) == pytest.approx({"bleu_1": 1, "bleu_avg": 1, "rouge_l": 1, "meteor": meteor(1, 1, 1, 4)})
    # a blank reference next to a real one is ignored rather than zeroing the example
    assert score_example("a b", ["", "a b"], resolve_config("mom", tokenizer="whitespace")).rouge_l == 1.0


def test_blank_flags() -> None:
    cfg = resolve_config("mom")
    assert score_example("", "北京", cfg).blank and score_example("北京", " ", cfg).blank
    assert not score_example("北京", "北京", cfg).blank
