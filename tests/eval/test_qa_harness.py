"""QA harness: real MiniLM + Milvus Lite, both systems scored; the answering LM is scripted (it echoes
the first retrieved passage), so the test checks retrieval and scoring plumbing, not a model."""

from __future__ import annotations

import json

import pytest

import eval.qa as qa
from eval.baselines import baseline_memories, fixed_length_spans
from memreader.schema import DocumentMemory, Scenario, tiling_problems, write_memories

DOC_A = ("Lighthouses guide ships at night with a rotating lamp. " * 3
         + "The keeper lived in a small cottage beside the tower and logged every passing vessel.")
DOC_B = "Bees collect nectar and turn it into honey inside wax cells. " * 4


class EchoFirstPassage:
    def generate_many(self, list_of_messages, params, progress_desc=None):
        assert params.temperature == 0.0
        return [m[-1]["content"].split("[1] ", 1)[1].split(".", 1)[0] + "." for m in list_of_messages]


@pytest.mark.parametrize("size", [1, 7, 180, 10_000])
def test_fixed_length_spans_tile(size) -> None:
    assert tiling_problems(fixed_length_spans(DOC_A, size), len(DOC_A)) == []
    with pytest.raises(ValueError, match="chunk size"):
        fixed_length_spans(DOC_A, 0)
    with pytest.raises(KeyError, match="fixed-180"):
        baseline_memories("nope", {"a": DOC_A})


def test_run_qa_scores_memreader_and_baseline(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    cut = DOC_A.index("The keeper")
    mems = [
        DocumentMemory("a", DOC_A, [Scenario("Lamps", "Rotating lamps guide ships.", 0, cut),
                                    Scenario("Keeper", "The keeper logged vessels.", cut, len(DOC_A))]),
        DocumentMemory("b", DOC_B, [Scenario("Honey", "Bees make honey.", 0, len(DOC_B))]),
    ]
    write_memories(tmp_path / "m.jsonl", mems)
    (tmp_path / "qa.jsonl").write_text(
        json.dumps({"id": "q1", "question": "Where did the lighthouse keeper live?",
                    "answers": ["The keeper lived in a small cottage beside the tower and logged every passing vessel."]}) + "\n"
        + json.dumps({"id": "q2", "question": "What do bees make from nectar?", "answers": ["Honey."]}) + "\n")
    monkeypatch.setattr(qa, "make_chat", lambda kind, **kw: EchoFirstPassage())
    cfg = qa.QAConfig(memories=str(tmp_path / "m.jsonl"), qa=str(tmp_path / "qa.jsonl"), run="q", top_k=2)
    report = qa.run_qa(cfg)
    systems = {s["system"]: s for s in report["systems"]}
    assert set(systems) == {"memreader", "fixed-180"}
    assert systems["memreader"]["mode"] == "three_layer" and systems["fixed-180"]["mode"] == "chunk_only"
    for s in systems.values():
        assert set(s["scores"]["metrics"]) == {"bleu_1", "bleu_avg", "rouge_l", "meteor"}
    # The keeper scenario is retrieved first, so the echoed answer is the reference sentence itself.
    assert systems["memreader"]["scores"]["metrics"]["rouge_l"]["per_example"][0] == pytest.approx(1.0)
    preds = [json.loads(x) for x in open(tmp_path / "home/runs/q/eval/predictions.memreader.jsonl")]
    assert preds[0]["retrieved"][0]["doc_id"] == "a" and preds[0]["retrieved"][0]["provenance"]
