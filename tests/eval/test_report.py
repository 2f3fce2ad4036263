"""``memreader report``: renders from a synthetic run folder (Markdown + decodable PNGs), its paired
tests equal eval.score.compare, and broken inputs give errors naming the file."""

from __future__ import annotations

import functools
import json
import re
import shutil
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from eval import paper_tables
from eval.clarity import MethodRow, correlate
from eval.report import ReportError, build_report, correlation, load_run, paired_comparisons
from eval.score import compare, score_pairs
from memreader.cli import main as cli
from memreader.schema import DocumentMemory, Scenario, write_memories

REFS = ["厦门大学位于福建省厦门市。", "The bridge was built in 1890.", "三个堆肥箱。", "Pepper is the cat.",
        "会议在周一举行。", "It rained all week.", "北京是中国的首都。", "The answer is forty-two."]
PREDICTIONS = {  # method -> predictions (same questions)
    "memreader": ["厦门大学在福建省厦门市。", "The bridge was built in 1890.", "三个堆肥箱。", "Pepper.",
                  "会议在周一。", "It rained all week long.", "北京是首都。", "forty-two"],
    "fixed-180": ["在福建。", "Built in 1890.", "两个箱子。", "A cat.", "周二。", "It rained.", "上海。", "42"],
    "semantic": ["福建省厦门市。", "The bridge, 1890.", "三个箱子。", "The cat is Pepper.", "周一举行。",
                 "Rain all week.", "北京。", "The answer is 42."],
    "llm": ["厦门。", "In 1890.", "三个。", "Pepper the cat.", "周一。", "Rain.", "首都北京。", "forty two"],
}
DOCS = {f"d{i}": ("Sentence one is here. Sentence two follows it. " * (3 + i))[: 60 + 25 * i] for i in range(4)}
CHUNK = {"memreader": 40, "fixed-180": 30, "semantic": 35, "llm": 50}
SCORE_OPTIONS = {"workers": 1, "n_resamples": 200, "meteor_wordnet": False}


def _memories(method: str) -> list[DocumentMemory]:
    out = []
    for doc_id, text in DOCS.items():
        size = CHUNK[method]
        spans = [(i, min(i + size, len(text))) for i in range(0, len(text), size)]
        meta = {"generation": {"guided": True}} if method == "memreader" else {"chunker": method}
        if method == "memreader" and doc_id == "d0":
            spans, meta = [(0, len(text))], {"fallback": "unusable reply"}
        out.append(DocumentMemory(doc_id, text, [Scenario("o", "c", s, e) for s, e in spans], meta=meta))
    return out


@functools.cache
def _scores(method: str) -> dict:
    ids = [f"q{i}" for i in range(len(REFS))]
    return score_pairs(PREDICTIONS[method], REFS, "mom", ids=ids, **SCORE_OPTIONS).to_dict()


def provenance(memories: list[DocumentMemory]) -> dict[str, int]:
    """The counts the evaluation stage records (eval.qa.memory_provenance), by hand."""
    guided = sum(bool(m.meta.get("generation")) for m in memories)
    fallback = sum("fallback" in m.meta for m in memories)
    return {"memories": len(memories), "guided": guided, "unguided": fallback, "fallback": fallback,
            "truncated": 0, "baseline": sum("chunker" in m.meta for m in memories)}


def make_run(root: Path, dataset: str = "longbench", path: str = "shared/longbench_multifieldqa_zh.jsonl") -> Path:
    """A run folder in the layout the evaluation stage writes (see docs/EVALUATION.md, "Report")."""
    folder = root / "runs" / "demo-run" / "eval"
    ids = [f"q{i}" for i in range(len(REFS))]
    rng = np.random.default_rng(0)
    methods = {}
    for k, (method, preds) in enumerate(PREDICTIONS.items()):
        mdir = folder / "methods" / method
        mdir.mkdir(parents=True)
        memories = _memories(method)
        write_memories(mdir / "memories.jsonl", memories)
        nll = [float(x) for x in rng.uniform(2.0, 4.0, len(ids)) + 0.2 * k]
        nll[3] = None if method == "llm" else nll[3]
        with (mdir / "answers.jsonl").open("w", encoding="utf-8") as fh:
            for i, q, p, r, s in zip(ids, ids, preds, REFS, nll, strict=True):
                fh.write(json.dumps({"id": i, "question": q, "answers": [r], "prediction": p,
                                     "retrieved": ["chunk"], "support_nll": s}, ensure_ascii=False) + "\n")
        scores = _scores(method)
        clarity = [None if len(m.scenarios) == 1 else 0.3 + 0.1 * k + 0.01 * j for j, m in enumerate(memories)]
        methods[method] = {
            "scores": scores,
            "support": {"per_example": nll, "ids": ids, "mean": float(np.mean([x for x in nll if x is not None])),
                        "signature": "Support|model:tiny|mr-support:1"},
            "clarity": {"per_memory": clarity, "doc_ids": list(DOCS), "signature": "Clarity|variant:ppl|mr-clarity:1",
                        "mean": float(np.mean([c for c in clarity if c is not None]))},
            "calibration": None if method == "memreader" else {
                "method": method, "param": "size", "value": CHUNK[method], "target_chars": 40, "tolerance": 0.1,
                "mean_chars": 38.0, "std_chars": 4.0, "n_chunks": 10, "within": True, "tried": [30, 40], "note": ""},
            "provenance": provenance(memories), "question_doc": {i: "d0" for i in ids}, "seconds": 1.5,
        }
    summary = {"settings": {"profile": "mom", "limit": 8}, "dataset": {"name": dataset, "path": path,
                                                                       "n_questions": len(ids)},
               "answer_model": "tiny", "embedder": "minilm-l6", "top_k": 8, "methods": methods,
               "profile": {"forward_share": 0.8, "seconds": {"answer": 3.0}}}
    (folder / "summary.json").write_text(json.dumps(summary, ensure_ascii=False), encoding="utf-8")
    (folder / "config.yaml").write_text("run: demo-run\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("report"))


def test_report_renders(run_folder: Path, tmp_path: Path):
    md_path, figures = build_report(run_folder, tmp_path / "out", n_resamples=200)
    md = md_path.read_text(encoding="utf-8")
    assert {p.name for p in figures} == {"metrics.png", "chunk_lengths.png", "clarity_rouge.png"}
    for png in figures:
        image = matplotlib.image.imread(png)  # decodes, or raises
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
        assert f"]({png.name})" in md
    for method in PREDICTIONS:
        assert f"| {method} |" in md
    summary = json.loads((run_folder / "summary.json").read_text(encoding="utf-8"))
    mr = summary["methods"]["memreader"]["scores"]["metrics"]["rouge_l"]
    assert f"{mr['value']:.4f} [{mr['ci_low']:.4f}, {mr['ci_high']:.4f}]" in md
    qa_row = next(line for line in md.splitlines() if line.startswith("| memreader | 8 |"))
    assert qa_row.endswith("| 4 | 1 | 0 |")  # memories, fallbacks, truncated
    assert mr["signature"] in md and "Support|model:tiny|mr-support:1" in md and "Clarity|variant:ppl" in md
    assert "Table 1, MultiFieldQA" in md and "Table 3" in md and "Table 2" in md
    assert "| paper | MemReader-7B | 0.2000 | 0.0837 | 0.2637 | 0.4043 |" in md
    saved = json.loads((tmp_path / "out" / "report.json").read_text(encoding="utf-8"))
    assert {r["method"] for r in saved["paired"]} == {"fixed-180", "semantic", "llm"}


def test_paired_comparisons_equal_score_compare(run_folder: Path):
    _, methods = load_run(run_folder)
    rows = paired_comparisons(methods, n_resamples=200, seed=12345)
    ids = [f"q{i}" for i in range(len(REFS))]
    ref = score_pairs(PREDICTIONS["memreader"], REFS, "mom", ids=ids, **SCORE_OPTIONS)
    other = score_pairs(PREDICTIONS["semantic"], REFS, "mom", ids=ids, **SCORE_OPTIONS)
    expected = compare(other, ref, n_resamples=200, seed=12345)
    for metric, test in expected.items():
        row = next(r for r in rows if r["method"] == "semantic" and r["metric"] == metric)
        assert row["delta"] == pytest.approx(test.delta) and row["p_bootstrap"] == pytest.approx(test.p_bootstrap)
        assert row["p_permutation"] == pytest.approx(test.p_permutation)
        assert row["interval"]["low"] == pytest.approx(test.interval.low)
    support = next(r for r in rows if r["method"] == "llm" and r["metric"] == "support")
    assert support["n"] == len(REFS) - 1  # the item without a support score is left out of both


def test_report_correlation_uses_per_item_arrays(run_folder: Path):
    _, methods = load_run(run_folder)
    got, why = correlation(methods, 100, seed=5)
    rows = [MethodRow(n, m.entry["scores"]["metrics"]["rouge_l"]["per_example"], m.entry["clarity"]["per_memory"])
            for n, m in methods.items()]
    assert why == "" and got == correlate(rows, 100, seed=5)
    two = {n: methods[n] for n in ("memreader", "llm")}
    assert correlation(two, 100, 5) == (None, "needs at least 3 methods with clarity and ROUGE-L; this run has 2 "
                                              "(memreader, llm)")


def test_cli_by_run_name_and_no_paper_match(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path))
    folder = make_run(tmp_path, dataset="jsonl", path="my_questions.jsonl")
    assert cli(["report", "demo-run", "--bootstrap", "50"]) == 0
    md = (folder / "report" / "report.md").read_text(encoding="utf-8")
    assert "none of the paper's" in md and "Table 1," not in md
    assert "report.md" in capsys.readouterr().out


def test_malformed_or_missing_inputs_name_the_file(run_folder: Path, tmp_path: Path, capsys):
    broken = tmp_path / "eval"
    shutil.copytree(run_folder, broken)
    summary = json.loads((broken / "summary.json").read_text(encoding="utf-8"))
    del summary["methods"]["semantic"]["provenance"]
    summary["methods"]["llm"]["scores"]["metrics"]["rouge_l"].pop("signature")
    (broken / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    with pytest.raises(ReportError, match=re.escape(str(broken / "summary.json"))) as err:
        load_run(broken)
    assert "methods.semantic.provenance" in str(err.value) and "methods.llm.scores.metrics.rouge_l" in str(err.value)
    (broken / "summary.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ReportError, match="not valid JSON"):
        load_run(broken)
    shutil.copy(run_folder / "summary.json", broken / "summary.json")
    (broken / "methods" / "llm" / "memories.jsonl").unlink()
    with pytest.raises(ReportError, match=re.escape(str(broken / "methods" / "llm" / "memories.jsonl"))):
        load_run(broken)
    assert cli(["report", str(tmp_path / "nowhere")]) == 2
    assert "no summary.json" in capsys.readouterr().err


def test_paper_tables_match_the_paper_text():
    text_path = Path(__file__).resolve().parents[2] / ".." / "shared" / "papers" / \
        "mom_mixtures_of_scenario_aware_document_memories.txt"
    if not text_path.is_file():
        pytest.skip(f"{text_path} is not here: the transcription is checked where the paper text is")
    lines = text_path.read_text(encoding="utf-8").splitlines()
    numbers = lambda line: [float(x) for x in re.findall(r"-?\d\.\d{3,4}", line)]  # noqa: E731
    for name in paper_tables.TABLE1["CRUD"]:
        line = next(x for x in lines if x.startswith(name + " 0.5"))
        assert numbers(line) == [v for d in ("CRUD", "OmniEval", "MultiFieldQA") for v in paper_tables.TABLE1[d][name]]
    for name, values in paper_tables.TABLE2.items():
        assert numbers(next(x for x in lines if x.startswith(name + " 0.4"))) == list(values)
    assert numbers(next(x for x in lines if x.startswith("Pearson Correlation"))) == list(paper_tables.TABLE2_PEARSON)
    for name, values in paper_tables.TABLE3.items():
        assert numbers(next(x for x in lines if x.startswith(name + " 3.") or x.startswith(name + " 2."))) == \
            list(values)
    assert paper_tables.match_dataset("longbench", "x/longbench_multifieldqa_zh.jsonl") == "MultiFieldQA"
    assert paper_tables.match_dataset("crud_qa") == "CRUD" and paper_tables.match_dataset("cmrc2018") is None
