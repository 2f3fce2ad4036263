"""QA harness: real MiniLM + Milvus Lite, every method scored; the answering LM is scripted (it echoes the first
retrieved passage), so these tests check retrieval, resumption and scoring plumbing, not a model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import memreader.eval.qa as qa
from memreader.core.config import ConfigError, load_config
from memreader.core.registry import SMOLLM2
from memreader.core.schema import DocumentMemory, Scenario, write_memories
from memreader.eval.method_run import StaleRunError
from tests.engine_fakes import fake_engines

DOC_A = ("Lighthouses guide ships at night with a rotating lamp. " * 3
         + "The keeper lived in a small cottage beside the tower and logged every passing vessel.")
DOC_B = "Bees collect nectar and turn it into honey inside wax cells. " * 4
QUESTIONS = [
    {"id": "q1", "question": "Where did the lighthouse keeper live?", "doc_id": "a",
     "answers": ["The keeper lived in a small cottage beside the tower and logged every passing vessel."]},
    {"id": "q2", "question": "What do bees make from nectar?", "answers": ["Honey."], "doc_id": "b"},
    {"id": "q3", "question": "What guides ships at night?", "answers": ["A rotating lamp."], "doc_id": "a"},
]


class EchoFirstPassage:
    """Answers with the first sentence of the first retrieved passage; counts questions; can fail on purpose."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.asked: list[str] = []
        self.fail_after = fail_after

    def generate_many(self, list_of_messages, params, progress_desc=None):
        assert params.temperature == 0.0
        if self.fail_after is not None and len(self.asked) >= self.fail_after:
            raise RuntimeError("the answering model crashed")
        self.asked += [m[-1]["content"] for m in list_of_messages]
        return [m[-1]["content"].split("[1] ", 1)[1].split(".", 1)[0] + "." for m in list_of_messages]


@pytest.fixture
def demo_files(tmp_path: Path, monkeypatch) -> dict[str, str]:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    cut = DOC_A.index("The keeper")
    mems = [
        DocumentMemory("a", DOC_A, [Scenario("Lamps", "Rotating lamps guide ships.", 0, cut),
                                    Scenario("Keeper", "The keeper logged vessels.", cut, len(DOC_A))]),
        DocumentMemory("b", DOC_B, [Scenario("Honey", "Bees make honey.", 0, len(DOC_B))]),
    ]
    write_memories(tmp_path / "m.jsonl", mems)
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS), encoding="utf-8")
    return {"memories": str(tmp_path / "m.jsonl"), "qa": str(tmp_path / "qa.jsonl"), "home": str(tmp_path / "home")}


def _cfg(files: dict[str, str], **kw) -> qa.QAConfig:
    base = dict(dataset="jsonl", memories=files["memories"], qa=files["qa"], run="q", top_k=2, methods=["memreader",
                "fixed"], target_chars=60, embedder="minilm-l6", support=False, clarity=False, report=False,
                answer_backend="transformers")
    base.update(kw)
    return qa.QAConfig(**base)


@pytest.mark.integration
def test_run_qa_scores_memreader_and_a_calibrated_chunker(demo_files, monkeypatch) -> None:
    built = fake_engines(monkeypatch, EchoFirstPassage())
    summary = qa.run_qa(_cfg(demo_files))
    # answering went through the engine rule and the factory
    assert [(b.backend, b.model, b.kwargs["batch_size"]) for b in built] == [("transformers", SMOLLM2, 8)]
    assert summary["engine"]["backend"] == "transformers" and summary["engine"]["device"] in ("cpu", "cuda")
    methods = summary["methods"]
    assert set(methods) == {"memreader", "fixed"}
    assert methods["memreader"]["mode"] == "three_layer" and methods["fixed"]["mode"] == "chunk_only"
    for m in methods.values():
        assert set(m["scores"]["metrics"]) == {"bleu_1", "bleu_avg", "rouge_l", "meteor"}
    # the keeper scenario is retrieved first, so the echoed answer is the reference sentence itself
    assert methods["memreader"]["scores"]["metrics"]["rouge_l"]["per_example"][0] == pytest.approx(1.0)
    cal = methods["fixed"]["calibration"]
    assert cal["within"] and abs(cal["mean_chars"] - 60) <= 6
    assert methods["memreader"]["calibration"]["note"].startswith("given memories")
    assert methods["fixed"]["provenance"]["baseline"] == 2
    rows = [json.loads(x) for x in open(Path(demo_files["home"]) / "runs/q/eval/methods/memreader/answers.jsonl")]
    assert [r["id"] for r in rows] == ["q1", "q2", "q3"]
    assert rows[0]["retrieved"][0]["doc_id"] == "a" and rows[0]["retrieved"][0]["provenance"]
    assert summary["profile"]["answers"] == 6


@pytest.mark.integration
def test_a_crash_repeats_no_finished_answer(demo_files, monkeypatch) -> None:
    crashing = EchoFirstPassage(fail_after=1)
    fake_engines(monkeypatch, crashing)
    with pytest.raises(RuntimeError, match="crashed"):
        qa.run_qa(_cfg(demo_files, answer_batch=1, methods=["memreader"]))
    answers = Path(demo_files["home"]) / "runs/q/eval/methods/memreader/answers.jsonl"
    assert len(answers.read_text().splitlines()) == 1
    with answers.open("a") as fh:  # a line torn by the crash is dropped and redone
        fh.write('{"id": "q2", "quest')
    resumed = EchoFirstPassage()
    fake_engines(monkeypatch, resumed)
    summary = qa.run_qa(_cfg(demo_files, answer_batch=1, methods=["memreader"]))
    assert len(resumed.asked) == 2, "only q2 and q3 are answered again"
    assert [json.loads(x)["id"] for x in answers.read_text().splitlines()] == ["q1", "q2", "q3"]
    assert summary["methods"]["memreader"]["scores"]["n"] == 3
    # the cost ledger adds both sessions up: the crashed one's answering time is kept, not lost
    cost = summary["methods"]["memreader"]["cost"]
    # (clarity=False here: a phase that does not run is not in the ledger)
    assert cost["sessions"] == 2 and set(cost["phases"]) == {"memories", "index", "answers", "stickiness"}
    assert cost["peak_rss_mib"] > 50 and cost["rss_source"] == "proc-tree"


@pytest.mark.integration
def test_other_settings_in_the_same_run_are_refused(demo_files, monkeypatch) -> None:
    fake_engines(monkeypatch, EchoFirstPassage())
    qa.run_qa(_cfg(demo_files, methods=["memreader"]))
    with pytest.raises(StaleRunError, match="top_k changed"):
        qa.run_qa(_cfg(demo_files, methods=["memreader"], top_k=1))


def test_config_problems_are_named() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(qa.QAConfig, None, ["qa=x.jsonl", "methods=[fixed, chonk]", "dataset=squad"])
    text = str(err.value)
    assert "unknown 'chonk'" in text and "lumber" in text and "dataset: 'squad'" in text
    with pytest.raises(ConfigError, match="memreader: give memories"):
        load_config(qa.QAConfig, None, ["qa=x.jsonl", "methods=[memreader]"])


def test_questions_without_answers_are_named(demo_files, monkeypatch) -> None:
    from memreader.eval.datasets import DatasetError

    path = Path(demo_files["qa"])
    path.write_text(json.dumps({"id": "q9", "question": "Why?", "answers": [" "], "doc_id": "a"}) + "\n")
    fake_engines(monkeypatch, EchoFirstPassage())
    with pytest.raises(DatasetError, match=r"no reference answer \(ids q9\)"):
        qa.run_qa(_cfg(demo_files))


class _CharTokenizer:
    def apply_chat_template(self, messages, add_generation_prompt, tokenize, return_dict):
        assert add_generation_prompt and tokenize and return_dict
        return {"input_ids": list(range(sum(len(m["content"]) for m in messages)))}


class _WindowedAnswerer:
    def __init__(self, window: int) -> None:
        self.window = window

    def tokenizer(self):
        return _CharTokenizer()

    def model_window(self):
        return self.window


def test_chunks_that_do_not_fit_the_window_are_dropped_lowest_ranked_first() -> None:
    from memreader.eval.answering import answer_messages, fit_chunks

    chunks = ["a" * 300, "b" * 300, "c" * 300]
    full = sum(len(m["content"]) for m in answer_messages("Why?", chunks))
    assert fit_chunks(_WindowedAnswerer(full + 10), "Why?", chunks, 10) == (chunks, 0)
    assert fit_chunks(_WindowedAnswerer(full + 9), "Why?", chunks, 10) == (chunks[:2], 1)
    assert fit_chunks(_WindowedAnswerer(50), "Why?", chunks, 10) == ([], 3)
    assert fit_chunks(EchoFirstPassage(), "Why?", chunks, 10) == (chunks, 0)  # remote: window unknown


def test_the_chunk_cache_is_one_folder_per_dataset_file(tmp_path, monkeypatch) -> None:
    from memreader.eval.qa import QAConfig, chunk_cache_dir

    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"id": "1"}\n', encoding="utf-8")
    b.write_text('{"id": "2"}\n', encoding="utf-8")
    shared = QAConfig(qa=str(a))
    first = chunk_cache_dir(shared, "multifieldqa_zh", str(a))
    assert first.startswith(str(tmp_path / "home" / "cache" / "chunkers" / "multifieldqa_zh-"))
    assert chunk_cache_dir(shared, "multifieldqa_zh", str(a)) == first  # every run on that file shares it
    assert chunk_cache_dir(shared, "multifieldqa_zh", str(b)) != first  # another file: its document ids may clash
    assert chunk_cache_dir(QAConfig(qa=str(a), chunk_cache="run"), "x", str(a)) == ""
    assert chunk_cache_dir(QAConfig(qa=str(a), chunk_cache=str(tmp_path / "mine")), "x", str(a)) == str(tmp_path / "mine")
    assert any("chunk_cache: empty" in p for p in QAConfig(qa=str(a), chunk_cache=" ").problems())
    assert any("is a file" in p for p in QAConfig(qa=str(a), chunk_cache=str(b)).problems())
