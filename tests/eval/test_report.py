"""``memreader report``: renders the output of a real tiny ``memreader eval`` (a random 2-layer model answers,
scores support and clarity) and of a synthetic run folder written through memreader.eval.records (Markdown + decodable
PNGs); its paired tests pair items by id and say what cannot be tested; its one correlation table filters methods
one way; broken inputs give errors naming the file."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import shutil
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from memreader.cli import main as cli
from memreader.core.paths import memreader_home
from memreader.core.schema import DocumentMemory, Scenario, write_memories
from memreader.eval import paper_tables
from memreader.eval.chunkers.base import Calibration
from memreader.eval.intrinsic import MethodRow, correlate, correlation_row
from memreader.eval.records import EvalSummary
from memreader.eval.report import Method, ReportError, build_report, load_run, paired_comparisons
from memreader.eval.score import score_pairs
from tests.eval.test_records import eval_summary, method_record

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
    """The counts the evaluation stage records (memreader.eval.records.ProvenanceRecord.of), by hand."""
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
                                     "retrieved": [{"doc_id": "d0", "scenario": 0, "text": f"the {method} chunk",
                                                    "source": "/data/d0.pdf", "pages": [2, 3],
                                                    "headings": ["Intro"]}], "support_nll": s}, ensure_ascii=False) + "\n")
        clarity = [None if len(m.scenarios) == 1 else 0.3 + 0.1 * k + 0.01 * j for j, m in enumerate(memories)]
        methods[method] = method_record(
            _scores(method), (nll, ids, "Support|model:tiny|mr-support:1", 0),
            (clarity, list(DOCS), "Clarity|variant:ppl|mr-clarity:1"), provenance(memories),
            calibration=None if method == "memreader" else Calibration(
                method, "size", CHUNK[method], 40, 0.1, 38.0, 4.0, 10, True, [(30, 31.0), (40, 38.0)], ""),
            question_doc=dict.fromkeys(ids, "d0"), mean_context_chars=100.0)
    summary = eval_summary(
        {"name": dataset, "path": path, "n_questions": len(ids), "n_documents": len(DOCS),
         "corpus_chars": sum(map(len, DOCS.values())), "mean_document_chars": 97.5},
        {"forward_share": 0.8, "answers": 32, "forward_calls": 64, "seconds": {"answer": 3.0}}, 40, 32, top_k=8,
        methods=methods, seconds=9.0)
    (folder / "summary.json").write_text(json.dumps(summary.to_dict(), ensure_ascii=False), encoding="utf-8")
    (folder / "config.yaml").write_text("run: demo-run\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("report"))


TINY_DOCS = {
    "harbour": ("The harbour opens at six. Fishing boats leave before dawn. The ferry to the island runs every hour. "
                "Tickets cost four euros. The last ferry leaves at ten. In winter the ferry stops at eight. "
                "A small cafe sells coffee by the pier. Gulls wait on the harbour wall."),
    "garden": ("The community garden has forty plots. Each plot is three metres wide. Members pay twenty euros a "
               "year. Water comes from two rain barrels. Tools are kept in the green shed. The shed key hangs by the "
               "gate. Compost bays stand behind the shed. Volunteers turn the compost on Saturdays."),
    "library": ("The library lends books for three weeks. Renewals can be made online. Children's books are on the "
                "ground floor. The reading room is upstairs. It is quiet from nine to five. Printing costs ten cents "
                "a page. The library closes on Mondays. A book club meets there every Thursday."),
}
TINY_QA = [("How often does the ferry to the island run?", "Every hour.", "harbour"),
           ("Where are the garden tools kept?", "In the green shed.", "garden"),
           ("How long does the library lend books?", "For three weeks.", "library"),
           ("When does the last ferry leave?", "At ten.", "harbour")]


@pytest.fixture(scope="module")
def tiny_eval(tmp_path_factory: pytest.TempPathFactory, tiny_model: str) -> Path:
    """A real ``memreader eval``: the random 2-layer ``tiny_model`` answers 4 questions and scores support and
    clarity for given memories (the memreader method) and the fixed and sentence chunkers calibrated to 60 chars."""
    root = tmp_path_factory.mktemp("tiny_eval")
    memories = []
    for doc_id, text in TINY_DOCS.items():
        cut = text.index(". ", len(text) // 2) + 2
        memories.append(DocumentMemory(doc_id, text, [Scenario(f"{doc_id} basics", text[:40], 0, cut),
                                                      Scenario(f"{doc_id} details", text[cut:cut + 40], cut, len(text))],
                                       meta={"generation": {"guided": True}}))
    write_memories(root / "memories.jsonl", memories)
    (root / "qa.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "question": q, "answers": [a], "doc_id": d}) + "\n"
                                           for i, (q, a, d) in enumerate(TINY_QA)), encoding="utf-8")
    settings = {"dataset": "jsonl", "qa": root / "qa.jsonl", "memories": root / "memories.jsonl", "run": "tiny-eval",
                "methods": "[memreader, fixed, sentence]", "target_chars": 60, "tolerance": 0.2,
                "answer_model": tiny_model, "evaluator": tiny_model, "answer_backend": "transformers",
                "dtype": "float32", "embedder": "minilm-l6", "top_k": 2, "max_new_tokens": 8, "report": "false"}
    assert cli(["eval", *(a for k, v in settings.items() for a in ("--set", f"{k}={v}"))]) == 0
    return memreader_home() / "runs" / "tiny-eval" / "eval"


@pytest.mark.integration
def test_report_of_a_real_tiny_eval(tiny_eval: Path, capsys) -> None:
    data = json.loads((tiny_eval / "summary.json").read_text(encoding="utf-8"))
    summary = EvalSummary.from_dict(data)
    assert json.dumps(summary.to_dict(), sort_keys=True) == json.dumps(data, sort_keys=True)  # exactly the records
    assert list(summary.methods) == ["memreader", "fixed", "sentence"] and summary.engine.dtype == "float32"
    for m in summary.methods.values():
        assert m.scores.ids == ["q0", "q1", "q2", "q3"] and m.support.n_scored == 4 and m.clarity.mean is not None
    assert summary.methods["fixed"].calibration.within and summary.methods["fixed"].provenance.baseline == 3
    assert summary.methods["memreader"].provenance.guided == 3

    assert cli(["report", "tiny-eval", "--bootstrap", "100"]) == 0
    assert "report.md" in capsys.readouterr().out
    out = tiny_eval / "report"
    md = (out / "report.md").read_text(encoding="utf-8")
    assert {p.name for p in out.glob("*.png")} == {"metrics.png", "chunk_lengths.png", "clarity_rouge.png",
                                                   "intrinsic_rouge.png"}
    # intrinsic quality: boundary clarity from the same forward passes, stickiness from the index embedder
    for name, m in summary.methods.items():
        bc = [v for v in m.clarity.boundary_clarity if v is not None]
        assert len(m.clarity.boundary_clarity) == 3 and bc and all(v > 0 for v in bc)
        assert m.clarity.boundary_clarity_mean == pytest.approx(sum(bc) / len(bc))
        assert m.stickiness.doc_ids == m.clarity.doc_ids and m.stickiness.mean >= 0 and m.stickiness.seconds >= 0
        row = next(line for line in md.splitlines() if line.startswith(f"| {name} | 3 | {m.clarity.mean:.4f} | "))
        assert f"| {m.clarity.boundary_clarity_mean:.4f} | {m.stickiness.mean:.4f} |" in row
        assert m.stickiness.signature in md
    assert "## Intrinsic chunk quality (MoC)" in md and "| stickiness | rouge_l | 3 |" in md
    assert summary.settings.line in md and "none of the paper's" in md
    for name, m in summary.methods.items():
        qa_row = next(line for line in md.splitlines() if line.startswith(f"| {name} | 4 | "))
        for metric in m.scores.metrics.values():
            assert f"{metric.value:.4f} [{metric.ci_low:.4f}, {metric.ci_high:.4f}]" in qa_row
            assert metric.signature in md
        assert qa_row.endswith(f"| {m.provenance.memories} | 0 | 0 |")
        assert f"| {name} | 4 | {m.support.mean:.3f} [" in md and f"| {name} | {m.clarity.mean:.4f} | 3 | 0 |" in md
        assert m.support.signature in md and m.clarity.signature in md
    assert "chunk_chars=" in md and "chunk_size=" in md and "given memories" in md
    assert "| clarity | rouge_l | 3 | " in md and "## Paired comparisons against memreader" in md
    saved = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert {(r["method"], r["metric"]) for r in saved["paired"]} == {
        (n, k) for n in ("fixed", "sentence") for k in [*summary.methods[n].scores.metrics, "support"]}
    assert "correlation" not in saved  # the clarity / ROUGE-L correlation is a row of the one table
    clarity_rouge = next(r for r in saved["intrinsic_correlations"] if (r["intrinsic"], r["qa"]) == ("clarity",
                                                                                                      "rouge_l"))
    assert clarity_rouge["methods"] == ["memreader", "fixed", "sentence"] and "pearson_interval" in clarity_rouge
    pairs = {(r["intrinsic"], r["qa"]) for r in saved["intrinsic_correlations"]}
    assert pairs == {(i, q) for i in ("clarity", "boundary clarity", "stickiness") for q in ("bleu_1", "rouge_l",
                                                                                           "meteor")}


def test_report_renders(run_folder: Path, tmp_path: Path):
    md_path, figures = build_report(run_folder, tmp_path / "out", n_resamples=200)
    md = md_path.read_text(encoding="utf-8")
    # the synthetic run has clarity but neither boundary clarity nor stickiness: one intrinsic panel
    assert {p.name for p in figures} == {"metrics.png", "chunk_lengths.png", "clarity_rouge.png", "intrinsic_rouge.png"}
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
    assert "## What each method retrieved (first question)" in md
    assert "| memreader | 1 | d0 | /data/d0.pdf p. 2-3 · Intro | the memreader chunk |" in md
    saved = json.loads((tmp_path / "out" / "report.json").read_text(encoding="utf-8"))
    assert {r["method"] for r in saved["paired"]} == {"fixed-180", "semantic", "llm"}


def _with(methods: dict[str, Method], name: str, **record: object) -> dict[str, Method]:
    """``methods`` with ``name``'s record fields replaced."""
    m = methods[name]
    return {**methods, name: dataclasses.replace(m, record=dataclasses.replace(m.record, **record))}


def test_paired_comparisons_pair_items_by_id_and_note_what_cannot_be_tested(run_folder: Path):
    _, methods = load_run(run_folder)
    rows = paired_comparisons(methods, n_resamples=200, seed=12345)
    metrics = list(methods["memreader"].record.scores.metrics)
    assert [(r["method"], r["metric"]) for r in rows] == [
        (n, k) for n in ("fixed-180", "semantic", "llm") for k in [*metrics, "support"]]
    scores = {n: methods[n].record.scores.metrics["rouge_l"].per_example for n in ("semantic", "memreader")}
    row = next(r for r in rows if r["method"] == "semantic" and r["metric"] == "rouge_l")
    assert row["delta"] == pytest.approx(np.mean(scores["semantic"]) - np.mean(scores["memreader"]))
    assert row["n"] == len(REFS) and row["interval"]["low"] <= row["delta"] <= row["interval"]["high"]
    assert 0 < row["p_bootstrap"] <= 1 and 0 < row["p_permutation"] <= 1
    support = next(r for r in rows if r["method"] == "llm" and r["metric"] == "support")
    llm, ref = methods["llm"].record.support.per_example, methods["memreader"].record.support.per_example
    both = [(a, b) for a, b in zip(llm, ref, strict=True) if a is not None]
    assert support["n"] == len(REFS) - 1  # the item without a support score is left out of both
    assert support["delta"] == pytest.approx(np.mean([a - b for a, b in both]))
    # in another order the same items pair up by id: the same test
    ref_support = methods["memreader"].record.support
    shuffled = dataclasses.replace(ref_support, ids=ref_support.ids[::-1], per_example=ref_support.per_example[::-1])
    again = paired_comparisons(_with(methods, "memreader", support=shuffled), n_resamples=200, seed=12345)
    assert next(r for r in again if r["method"] == "llm" and r["metric"] == "support") == support
    semantic = methods["semantic"].record
    changed = {**semantic.scores.metrics, "meteor": dataclasses.replace(semantic.scores.metrics["meteor"],
                                                                        signature="METEOR|other")}
    notes = paired_comparisons(_with(methods, "semantic", support=None,
                                     scores=dataclasses.replace(semantic.scores, metrics=changed)), n_resamples=50)
    notes = {r["metric"]: r.get("note") for r in notes if r["method"] == "semantic"}
    assert notes["meteor"] == "signatures differ: not comparable" and notes["support"] == "not measured for both"
    assert notes["rouge_l"] is None


def test_report_correlation_uses_per_item_arrays(run_folder: Path):
    _, methods = load_run(run_folder)
    got = correlation_row(methods, "clarity", "rouge_l", 100, seed=5)
    rows = [MethodRow(n, m.record.scores.metrics["rouge_l"].per_example, m.record.clarity.per_memory)
            for n, m in methods.items()]
    assert got.note == "" and got.correlation == correlate(rows, 100, seed=5)
    two = {n: methods[n] for n in ("memreader", "llm")}
    assert correlation_row(two, "clarity", "rouge_l", 100, 5).note == (
        "needs at least 3 methods with clarity and rouge_l; this run has 2 (memreader, llm)")


def test_the_correlation_filter_leaves_out_methods_without_a_defined_value(run_folder: Path):
    _, methods = load_run(run_folder)
    clarity = methods["llm"].record.clarity
    none = dataclasses.replace(clarity, per_memory=[None] * len(clarity.per_memory), mean=None)
    row = correlation_row(_with(methods, "llm", clarity=none), "clarity", "rouge_l", 100, seed=5)
    assert row.methods == ["memreader", "fixed-180", "semantic"] and row.correlation is not None
    assert row.correlation.methods == row.methods
    assert row.to_dict()["methods"] == row.methods  # the computed correlation's order, as in report.json
    assert correlation_row(_with(methods, "llm", clarity=None), "clarity", "meteor", 100, 5).methods == row.methods


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
    assert f"re-run `memreader eval --config {broken / 'config.yaml'}`" in str(err.value)
    (broken / "summary.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ReportError, match="not valid JSON"):
        load_run(broken)
    shutil.copy(run_folder / "summary.json", broken / "summary.json")
    (broken / "methods" / "llm" / "memories.jsonl").unlink()
    with pytest.raises(ReportError, match=re.escape(str(broken / "methods" / "llm" / "memories.jsonl"))):
        load_run(broken)
    assert cli(["report", str(tmp_path / "nowhere")]) == 2
    assert "no summary.json" in capsys.readouterr().err


@pytest.mark.slow  # opt-in: reads the paper's text in ../shared/papers (skipped, naming it, where it is absent)
def test_paper_tables_match_the_paper_text(shared_papers: Path):
    lines = (shared_papers / "mom_mixtures_of_scenario_aware_document_memories.txt").read_text(
        encoding="utf-8").splitlines()
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


def test_paper_datasets_are_matched_by_loader_and_file_name():
    assert paper_tables.match_dataset("longbench", "x/longbench_multifieldqa_zh.jsonl") == "MultiFieldQA"
    assert paper_tables.match_dataset("crud_qa") == "CRUD" and paper_tables.match_dataset("cmrc2018") is None


def test_report_html_in_the_browser(run_folder: Path, tmp_path: Path, browser) -> None:
    """report.html holds the Markdown's tables and plots (inlined), and per question each method's prediction,
    scores (the best in bold) and retrieved chunks beside the reference; text with markup shows as written."""
    from selenium.webdriver.common.by import By

    from tests.browser import console_errors, open_page

    folder = tmp_path / "eval"
    shutil.copytree(run_folder, folder)
    answers = folder / "methods" / "memreader" / "answers.jsonl"
    rows = [json.loads(line) for line in answers.read_text(encoding="utf-8").splitlines()]
    rows[0]["prediction"] = "<script>window.__pwned = 1</script></div>"
    answers.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    build_report(folder, tmp_path / "out", n_resamples=50)
    page = tmp_path / "out" / "report.html"
    open_page(browser, page)
    assert browser.execute_script("return window.__pwned") is None
    images = browser.find_elements(By.CSS_SELECTOR, ".md img")
    assert len(images) == 4 and all(browser.execute_script("return arguments[0].naturalWidth", i) > 100 for i in images)
    assert browser.find_elements(By.CSS_SELECTOR, ".md table")  # the Markdown tables, rendered
    questions = browser.find_elements(By.CSS_SELECTOR, "details.question")
    assert [q.get_attribute("data-id") for q in questions] == [f"q{i}" for i in range(len(REFS))]
    first = questions[0]
    assert REFS[0] in first.find_element(By.CSS_SELECTOR, ".ref").text
    columns = first.find_elements(By.CSS_SELECTOR, ".method")
    assert [c.get_attribute("data-method") for c in columns] == list(PREDICTIONS)
    assert columns[0].find_element(By.CSS_SELECTOR, ".pred").text == rows[0]["prediction"]
    assert "the memreader chunk" in columns[0].text and "/data/d0.pdf p. 2-3 · Intro" in columns[0].text
    assert first.find_elements(By.CSS_SELECTOR, "td.best")
    assert console_errors(browser) == []
