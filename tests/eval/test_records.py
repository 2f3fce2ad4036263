"""memreader.eval.records: the summary.json contract between `memreader eval` and `memreader report`. Records round-trip
through JSON; a broken summary names the file, every bad key and the fix; an older summary still reads."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from memreader.core.schema import DocumentMemory, Scenario
from memreader.eval.chunkers.base import Calibration
from memreader.eval.records import (
    ClarityRecord,
    DatasetRecord,
    EngineRecord,
    EvalSummary,
    MethodRecord,
    ProfileRecord,
    ProvenanceRecord,
    RunSettings,
    ScoresRecord,
    SummaryError,
    SupportRecord,
    calibration_from_dict,
)
from memreader.eval.score import score_pairs

IDS = ["q1", "q2", "q3"]


def method_record(scores: dict, support: tuple, clarity: tuple, provenance: dict[str, int],
                  **rest: Any) -> MethodRecord:
    """A method's record from ``scores`` (a ScoresRecord dict), the arguments of SupportRecord.of and ClarityRecord.of
    and the provenance counts, answered in chunk_only mode in 1.5 s (test_report's run is built with it too)."""
    return MethodRecord(scores=ScoresRecord.from_dict(scores), support=SupportRecord.of(*support),
                        clarity=ClarityRecord.of(*clarity), provenance=ProvenanceRecord(**provenance),
                        mode="chunk_only", seconds=1.5, **rest)


def eval_summary(dataset: dict[str, Any], profile: dict[str, Any], target_chars: int, max_new_tokens: int,
                 **rest: Any) -> EvalSummary:
    """A run's summary over ``dataset`` (DatasetRecord's fields), answered by "tiny" over minilm-l6 in three_layer
    mode with the mom profile and tolerance 0.1; ``profile``: ProfileRecord's fields."""
    data = DatasetRecord(**dataset)
    settings = RunSettings(line=f"dataset={data.name} questions={data.n_questions}", target_chars=target_chars,
                           tolerance=0.1, mode="three_layer", profile="mom", max_new_tokens=max_new_tokens)
    return EvalSummary(settings=settings, dataset=data, answer_model="tiny", embedder="minilm-l6",
                       profile=ProfileRecord(**profile), **rest)


def _method(name: str, predictions: list[str]) -> MethodRecord:
    scores = score_pairs(predictions, ["Every hour.", "In the green shed.", "For three weeks."], "mom", ids=IDS,
                         workers=1, n_resamples=50, meteor_wordnet=False)
    return method_record(
        scores.to_dict(), ([2.5, None, 3.25], IDS, "Support|model:tiny", 1),
        ([0.4, None], ["a", "b"], "Clarity|variant:ppl"),
        {"memories": 2, "guided": 0, "unguided": 0, "fallback": 0, "truncated": 0, "baseline": 2},
        calibration=Calibration(name, "chunk_chars", 60, 60, 0.1, 58.5, 3.0, 9, True, [(60, 58.5)], "", 2, 2),
        question_doc={"q1": "a", "q2": "b", "q3": None}, mean_context_chars=120.5, questions_with_chunks_left_out=0)


@pytest.fixture(scope="module")
def summary() -> EvalSummary:
    return eval_summary(
        {"name": "jsonl", "path": "qa.jsonl", "n_questions": 3, "n_documents": 2, "corpus_chars": 500,
         "mean_document_chars": 250.0},
        {"forward_share": 0.9, "answers": 6, "forward_calls": 48, "seconds": {"generation": 1.0}}, 60, 8, top_k=2,
        methods={"fixed": _method("fixed", ["Every hour.", "In a shed.", "Three weeks."]),
                 "sentence": _method("sentence", ["Hourly.", "The green shed.", "For three weeks."])},
        engine=EngineRecord(stage="answer", backend="transformers", dtype="float32", why="asked for"), seconds=9.5)


def _json(data: dict) -> dict:
    return json.loads(json.dumps(data))


def test_round_trip(summary: EvalSummary) -> None:
    assert EvalSummary.from_dict(summary.to_dict()) == summary
    data = _json(summary.to_dict())
    assert EvalSummary.from_dict(data) == summary  # through JSON: tuples come back as lists, and are read back
    assert _json(EvalSummary.from_dict(data).to_dict()) == data
    method = summary.methods["fixed"]
    assert MethodRecord.from_dict(method.to_dict()) == method
    assert calibration_from_dict(_json(method.calibration.to_dict())) == method.calibration
    # the keys every run has written: the records add none of their own but n_scored / n_single_chunk
    assert set(data) == {"settings", "dataset", "answer_model", "embedder", "top_k", "methods", "profile", "engine",
                         "seconds"}
    assert set(data["methods"]["fixed"]) == {"scores", "support", "clarity", "calibration", "provenance", "question_doc",
                                             "mode", "mean_context_chars", "questions_with_chunks_left_out", "seconds", "cost",
                                             "stickiness"}
    assert data["methods"]["fixed"]["support"] == {"per_example": [2.5, None, 3.25], "ids": IDS, "mean": 2.875,
                                                   "signature": "Support|model:tiny", "n_truncated": 1, "n_scored": 2}
    assert data["methods"]["fixed"]["clarity"]["n_single_chunk"] == 1


def test_provenance_counts_how_memories_were_made() -> None:
    text = "One. Two."
    memories = [DocumentMemory("a", text, [Scenario("o", "c", 0, len(text))], meta=meta) for meta in (
        {"generation": {"guided": True}}, {"generation": {"guided": False}, "truncated": True},
        {"fallback": "unusable reply"}, {"chunker": "fixed"})]
    record = ProvenanceRecord.of(memories)
    assert record == ProvenanceRecord(memories=4, guided=1, unguided=2, fallback=1, truncated=1, baseline=1)
    assert record.line().startswith("4 memories: 1 guided, 2 unguided, 1 whole-document fallbacks")


def test_a_broken_summary_names_the_file_every_key_and_the_fix(summary: EvalSummary, tmp_path: Path) -> None:
    data = _json(summary.to_dict())
    broken = copy.deepcopy(data)
    del broken["methods"]["fixed"]["provenance"]
    broken["methods"]["fixed"]["scores"]["metrics"]["rouge_l"]["per_example"].pop()
    broken["methods"]["sentence"]["support"]["mean"] = "low"
    broken["methods"]["sentence"]["calibration"]["tolerance"] = 10
    broken["top_k"] = "8"
    (tmp_path / "config.yaml").write_text("run: x\n", encoding="utf-8")
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(broken), encoding="utf-8")
    with pytest.raises(SummaryError) as err:
        EvalSummary.read(path)
    text = str(err.value)
    assert text.startswith(f"{path}: malformed summary (5 problem(s)): ")
    for part in ("'methods.fixed.provenance' missing (expected an object)",
                 "'methods.fixed.scores.metrics.rouge_l.per_example' has 2 values for the 3 ids of "
                 "'methods.fixed.scores.ids'",
                 "'methods.sentence.support.mean' is a string, expected a number or null",
                 "'methods.sentence.calibration.tolerance' is 10, expected a fraction in [0, 1)",
                 "'top_k' is a string, expected an integer",
                 f"fix: re-run `memreader eval --config {tmp_path / 'config.yaml'}`"):
        assert part in text
    for bad, message in (([], "the top level is a list"), ({**data, "methods": {}}, "'methods' is empty"),
                         ({**data, "methods": {"fixed": 3}}, "'methods.fixed' is an integer, expected an object")):
        with pytest.raises(SummaryError, match=re.escape(message)):
            EvalSummary.from_dict(bad, "run/summary.json")
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(SummaryError, match="not valid JSON"):
        EvalSummary.read(path)


def test_an_older_summary_still_reads(summary: EvalSummary) -> None:
    """Keys added to the format later are optional; a method without support or clarity was not measured."""
    data = _json(summary.to_dict())
    del data["engine"]
    fixed = data["methods"]["fixed"]
    for key in ("questions_with_chunks_left_out", "clarity"):
        del fixed[key]
    del fixed["support"]["n_scored"]
    del fixed["calibration"]["n_docs"], fixed["calibration"]["calibration_docs"]
    data["methods"]["sentence"]["support"] = None
    old = EvalSummary.from_dict(data)
    assert old.engine is None and old.methods["sentence"].support is None
    assert old.methods["fixed"].clarity is None and old.methods["fixed"].questions_with_chunks_left_out is None
    assert old.methods["fixed"].support.n_scored is None and old.methods["fixed"].calibration.n_docs == 0
    assert old.methods["fixed"].scores == summary.methods["fixed"].scores
