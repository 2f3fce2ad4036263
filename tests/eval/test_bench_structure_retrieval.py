"""scripts/bench_structure_retrieval.py: the overlap rule, recall arithmetic and input checks, on a tiny gold file
with a keyword-count embedder (MiniLM is left to the real run: loading it is an integration test here)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from memreader.core.schema import DocumentMemory, Scenario, write_memories

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))  # its `from _common import ...`, as `python scripts/x.py` finds it
spec = importlib.util.spec_from_file_location("bench_structure_retrieval",
                                              REPO / "scripts" / "bench_structure_retrieval.py")
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench  # its dataclasses look their module up there
spec.loader.exec_module(bench)

VOCAB = ("alpha", "bravo", "charlie", "delta")
FILL = "It is a word that stands for a letter in the radio alphabet and nothing more."
PASSAGES = {t: f"{t.capitalize()} {t} {t}. {FILL} {FILL}" for t in VOCAB}  # 170-182 characters


class KeywordEmbedder:
    """One dimension per keyword (its count) plus a constant one, so every text has a direction."""

    def encode(self, sentences: list[str], **_: object) -> np.ndarray:
        words = [s.lower().replace(".", " ").replace("?", " ").split() for s in sentences]
        return np.array([[w.count(v) for v in VOCAB] + [0.01] for w in words], dtype=np.float32)


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, Path]:
    docs = [("en-dev-0000", ["alpha", "bravo"]), ("en-dev-0001", ["charlie", "delta"])]
    records, gold_mems, whole_mems = [], [], []
    for doc_id, titles in docs:
        texts = [PASSAGES[titles[0]] + " ", PASSAGES[titles[1]]]
        text = "".join(texts)
        sections = [{"title": t, "text": x} for t, x in zip(titles, texts, strict=True)]
        records.append({"id": doc_id, "text": text, "lang": "en", "source": "hotpotqa", "boundaries": [len(texts[0])],
                        "titles": titles, "sections": sections})
        cut = len(texts[0])
        gold_mems.append(DocumentMemory(doc_id, text, [Scenario(titles[0], "", 0, cut),
                                                       Scenario(titles[1], "", cut, len(text))]))
        whole_mems.append(DocumentMemory(doc_id, text, [Scenario("", "", 0, len(text))]))
    records.append({"id": "zh-dev-0000", "text": "中文。", "lang": "zh", "source": "cmrc2018", "boundaries": [],
                    "titles": ["x"], "sections": [{"title": "x", "text": "中文。"}]})
    gold = tmp_path / "dev.jsonl"
    gold.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    qa = [  # supporting_facts as Python-literal strings, as in the shared copy
        {"_id": "q0", "question": "Alpha and bravo?", "answer": "x", "context": "[]",
         "supporting_facts": "[['alpha', 0], ['bravo', 1], ['alpha', 2]]"},
        {"_id": "q1", "question": "Charlie?", "answer": "x", "context": "[]",
         "supporting_facts": "[['charlie', 0], ['echo', 0]]"},
        {"_id": "q2", "question": "Foxtrot?", "answer": "x", "context": "[]", "supporting_facts": "[['foxtrot', 0]]"},
        {"_id": "q3", "question": "Not a dev question", "answer": "x", "context": "[]", "supporting_facts": "[]"},
    ]
    (tmp_path / "qa.json").write_text(json.dumps(qa), encoding="utf-8")
    (tmp_path / "manifest.json").write_text(json.dumps({"dev_questions": [0, 1, 2]}), encoding="utf-8")
    write_memories(tmp_path / "gold_mem.jsonl", gold_mems)
    write_memories(tmp_path / "whole_mem.jsonl", whole_mems)
    return {"gold": gold, "qa": tmp_path / "qa.json", "manifest": tmp_path / "manifest.json",
            "gold_mem": tmp_path / "gold_mem.jsonl", "whole_mem": tmp_path / "whole_mem.jsonl", "dir": tmp_path}


def test_overlap_rule() -> None:
    passage = bench.Span("d", 100, 300)  # 200 characters: a hit needs min(100, 100) = 100
    assert not bench.is_hit(bench.Span("d", 0, 199), passage)  # 99 shared
    assert bench.is_hit(bench.Span("d", 0, 200), passage)
    assert bench.is_hit(bench.Span("d", 200, 900), passage)
    assert not bench.is_hit(bench.Span("e", 0, 900), passage)  # another document
    short = bench.Span("d", 0, 60)  # half the passage: 30
    assert bench.is_hit(bench.Span("d", 30, 500), short) and not bench.is_hit(bench.Span("d", 31, 500), short)
    assert bench.is_hit(bench.Span("d", 0, 150), bench.Span("d", 0, 1000), min_overlap=150)


def test_recall_arithmetic_and_report(inputs: dict[str, Path], capsys) -> None:
    out = inputs["dir"] / "bench.json"
    argv = ["--gold", str(inputs["gold"]), "--manifest", str(inputs["manifest"]), "--qa", str(inputs["qa"]),
            "--method", f"gold={inputs['gold_mem']}", "--method", f"whole={inputs['whole_mem']}",
            "--k", "1,2,3", "--resamples", "200", "--with-outline", "--out", str(out)]
    assert bench.main(argv, embedder=KeywordEmbedder()) == 0
    printed = capsys.readouterr().out
    assert "ratio to gold" in printed and "SupportRecall|k:1,2,3|" in printed
    assert "2 scored (1 with no supporting title in the corpus), 3 supporting titles present, 2 absent" in printed
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["qa"]["unscored"] == ["q2"] and data["baseline"] == "gold"
    gold, whole = data["methods"]["gold"], data["methods"]["whole"]
    # q0: alpha and bravo tie, the stable sort puts alpha first: 1/2 at k=1; q1: charlie first (echo is absent)
    assert gold["recall"] == {"1": 0.75, "2": 1.0, "3": 1.0}
    assert gold["all_found"] == {"1": 0.5, "2": 1.0, "3": 1.0}
    assert gold["questions"][0]["first_hit_rank"] == {"alpha": 0, "bravo": 1}
    size = {t: len(p) + 1 for t, p in PASSAGES.items()}  # a first section's chunk holds the joining space
    size["bravo"] -= 1
    size["delta"] -= 1
    assert gold["n_chunks"] == 4 and gold["mean_chunk_chars"] == pytest.approx(sum(size.values()) / 4, abs=0.05)
    assert gold["retrieved_chars"]["1"] == pytest.approx((size["alpha"] + size["charlie"]) / 2, abs=0.05)
    # one chunk per document covers both of its passages at k=1, with twice the characters
    docs = (size["alpha"] + size["bravo"], size["charlie"] + size["delta"])
    assert whole["recall"]["1"] == 1.0 and whole["retrieved_chars"]["1"] == pytest.approx(sum(docs) / 2, abs=0.05)
    assert data["ratios"]["whole"]["recall"]["1"] == pytest.approx(1 / 0.75, abs=1e-3)
    lo, hi = gold["recall_ci"]["1"]
    assert 0.5 <= lo <= 0.75 <= hi <= 1.0
    # outline rows only for the method that writes an outline
    assert "gold+outline" in data["methods"] and "whole+outline" not in data["methods"]


def test_memories_must_hold_the_gold_texts(inputs: dict[str, Path], capsys) -> None:
    texts, _ = bench.load_gold(inputs["gold"])
    assert list(texts) == ["en-dev-0000", "en-dev-0001"]  # the Chinese record is not used
    bad = inputs["dir"] / "bad.jsonl"
    changed = {d: t.replace("Charlie", "Charly") for d, t in texts.items()}
    write_memories(bad, [DocumentMemory(d, t, [Scenario("", "", 0, len(t))]) for d, t in changed.items()])
    with pytest.raises(bench.BenchError, match="'en-dev-0001' differs from the gold text at character 5"):
        bench.method_chunks("bad", bad, texts)
    write_memories(bad, [DocumentMemory("en-dev-0000", texts["en-dev-0000"],
                                        [Scenario("", "", 0, len(texts["en-dev-0000"]))])])
    argv = ["--gold", str(inputs["gold"]), "--manifest", str(inputs["manifest"]), "--qa", str(inputs["qa"]),
            "--method", f"bad={bad}"]
    assert bench.main(argv, embedder=KeywordEmbedder()) == 2
    assert "lacks 1 of the 2 hotpotqa gold documents (first: 'en-dev-0001')" in capsys.readouterr().err
