"""Support corpora (eval/support_corpora.py): passages, gold support, what is left out and why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memreader.eval.datasets import DatasetError
from memreader.eval.support_corpora import (
    SupportCorpus,
    SupportQuestion,
    cmrc2018_support,
    load_support_corpus,
    multifieldqa_support,
    support_recall,
)

SHARED = Path(__file__).resolve().parents[3] / "shared" / "datasets"


def _cmrc(path: Path) -> Path:
    paragraphs = [{"id": f"P{i}", "context": f"第{i}段。" + "内容" * 20,
                   "qas": [{"id": f"Q{i}-{j}", "question": f"问题{i}-{j}？", "answers": [{"text": "内容", "answer_start": 3}]}
                           for j in range(3)]} for i in range(6)]
    path.write_text(json.dumps({"data": [{"title": "T", "paragraphs": paragraphs}]}, ensure_ascii=False), encoding="utf-8")
    return path


def test_cmrc2018_one_question_per_paragraph_its_own_paragraph_gold(tmp_path):
    path = _cmrc(tmp_path / "cmrc.json")
    corpus = cmrc2018_support(path, questions=4, seed=3)
    assert [p[0] for p in corpus.passages] == [f"P{i}" for i in range(6)]  # every paragraph is searched
    assert len(corpus.questions) == 4
    paragraphs = [next(iter(q.gold)) for q in corpus.questions]
    assert len(set(paragraphs)) == 4  # distinct paragraphs
    assert all(q.id.split("-")[0] == "Q" + p[1:] for q, p in zip(corpus.questions, paragraphs, strict=True))
    assert cmrc2018_support(path, questions=4, seed=3) == corpus  # seeded
    assert len(cmrc2018_support(path, questions=99).questions) == 6  # at most one per paragraph
    with pytest.raises(ValueError, match="questions must be >= 1"):
        cmrc2018_support(path, questions=0)


def _mfqa(path: Path) -> Path:
    rows = [
        # answer verbatim in exactly one passage: kept
        {"_id": "a", "input": "哪个城市？", "answers": "['厦门大学。']",
         "context": "第一段讲历史，这是很长的一句话用来凑够长度。\n学校位于厦门大学附近，环境优美。\n" + "无关内容。" * 30},
        # written in other words: left out
        {"_id": "b", "input": "多少人？", "answers": "['大约一百人']", "context": "会员有127个单位。\n" + "其他。" * 10},
        # recurs in two passages: left out
        {"_id": "c", "input": "哪年？", "answers": "['1979年']",
         "context": "成立于1979年。" + "填充文字。" * 60 + "\n再次提到1979年的事。"},
    ]
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    return path


def test_multifieldqa_keeps_only_answers_verbatim_in_one_passage(tmp_path):
    corpus = multifieldqa_support(_mfqa(tmp_path / "mf.jsonl"), max_chars=60)
    assert [q.id for q in corpus.questions] == ["a"]
    (gold,) = corpus.questions[0].gold
    text = dict((pid, t) for pid, _, t in corpus.passages)[gold]
    assert "厦门大学" in text and gold.startswith("a#")
    assert "1 question(s) left out whose answer is not verbatim" in corpus.note and "1 whose answer recurs" in corpus.note
    # passages of every context are searched, each of whole sentences and at most max_chars unless one sentence is longer
    assert {pid.split("#")[0] for pid, _, _ in corpus.passages} == {"a", "b", "c"}
    assert all(len(t) <= 60 for pid, _, t in corpus.passages if pid.startswith("b#"))
    with pytest.raises(ValueError, match="max_chars"):
        multifieldqa_support(tmp_path / "mf.jsonl", max_chars=5)


def test_corpus_refuses_gold_outside_the_passages_and_empty_question_sets():
    passages = [("p1", "p1", "text")]
    with pytest.raises(DatasetError, match="name gold passages the corpus lacks"):
        SupportCorpus("x", "en", passages, [SupportQuestion("q", "?", frozenset({"p2"}))], "src")
    with pytest.raises(DatasetError, match="no question with gold support"):
        SupportCorpus("x", "en", passages, [], "src")


def test_load_support_corpus_names_the_missing_file_and_unknown_names(tmp_path):
    with pytest.raises(FileNotFoundError, match="cmrc2018_dev.json not found"):
        load_support_corpus("cmrc2018", tmp_path)
    with pytest.raises(ValueError, match="unknown support corpus 'musique'"):
        load_support_corpus("musique", tmp_path)


def test_support_recall_is_the_share_of_gold_found():
    assert support_recall(frozenset({"a", "b"}), ["b", "c"]) == 0.5
    assert support_recall({"a"}, []) == 0.0


@pytest.mark.skipif(not (SHARED / "hotpotqa_100_qa.json").is_file(), reason="../shared/datasets not present")
def test_the_shared_corpora_load_with_their_documented_sizes():
    hotpot = load_support_corpus("hotpotqa", SHARED)
    assert (len(hotpot.passages), len(hotpot.questions)) == (994, 100)
    assert all(len(q.gold) == 2 for q in hotpot.questions)
    cmrc = load_support_corpus("cmrc2018", SHARED)
    assert (len(cmrc.passages), len(cmrc.questions), cmrc.language) == (848, 100, "zh")
    mfqa = load_support_corpus("multifieldqa_zh", SHARED)
    assert (len(mfqa.passages), len(mfqa.questions)) == (2285, 38)  # distinct passages; answers in exactly one
