"""Property tests: the line-aware JSON parser against ``json``, and BLEU / ROUGE-L on arbitrary token
lists against sacrebleu and rouge-score."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rouge_score import rouge_scorer
from sacrebleu.metrics import BLEU

from memreader.eval.datasets import DatasetError, LocatedJson
from memreader.eval.metrics import bleu_from_stats, bleu_stats, resolve_config, rouge_l

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)
TOKENS = st.lists(st.sampled_from(["北京", "上海", " ", "的", "。", "a", "b"]), max_size=12)


class _Given:
    def tokenize(self, tokens: list[str]) -> list[str]:
        return tokens


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=JSON, indent=st.sampled_from([None, 1, 2]))
def test_located_json_parses_like_json(tmp_path: Path, value, indent) -> None:
    path = tmp_path / "doc.json"
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    path.write_text(text, encoding="utf-8")
    doc = LocatedJson(path)
    assert doc.value == json.loads(text)
    assert 1 <= doc.line(()) <= text.count("\n") + 1
    if len(text) > 1:
        path.write_text(text[:-1], encoding="utf-8")
        try:
            truncated = json.loads(text[:-1])
        except json.JSONDecodeError:
            with pytest.raises(DatasetError, match=str(path)):
                LocatedJson(path)
        else:  # cutting a number's last digit can leave valid JSON
            assert LocatedJson(path).value == truncated


@settings(max_examples=300, deadline=None)  # wall-time deadlines flake on a loaded 2-core machine
@given(hyp=TOKENS.filter(bool), ref=TOKENS.filter(bool))
def test_bleu_on_token_lists_matches_sacrebleu(hyp: list[str], ref: list[str]) -> None:
    vocab: dict[str, str] = {}
    def ids(tokens: list[str]) -> str:
        return " ".join(vocab.setdefault(t, f"t{len(vocab)}") for t in tokens)
    theirs = BLEU(tokenize="none", smooth_method="none", effective_order=False).sentence_score(ids(hyp), [ids(ref)])
    b1, bavg = bleu_from_stats(bleu_stats(hyp, [ref]), resolve_config("mom"))
    assert b1 == pytest.approx(theirs.precisions[0] / 100, rel=1e-12, abs=1e-15)
    assert bavg == pytest.approx(theirs.score / 100, rel=1e-9, abs=1e-15)


@settings(max_examples=300, deadline=None)  # wall-time deadlines flake on a loaded 2-core machine
@given(hyp=TOKENS, ref=TOKENS)
def test_rouge_l_on_token_lists_matches_rouge_score(hyp: list[str], ref: list[str]) -> None:
    expected = rouge_scorer.RougeScorer(["rougeL"], tokenizer=_Given()).score(ref, hyp)["rougeL"].fmeasure
    assert rouge_l(hyp, ref) == expected
