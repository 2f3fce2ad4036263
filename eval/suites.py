"""Evaluation sets: a benchmark file → the questions and the pooled corpus every method chunks.

    from memreader.eval.suites import load_eval_set
    es = load_eval_set("multifieldqa_zh", "../shared/datasets/longbench_multifieldqa_zh.jsonl", limit=20)
    es.documents      # {doc_id: text}: every evidence document once (the corpus the methods chunk and index)
    es.questions      # [QARecord]: with their reference answers
    es.question_docs  # {question id: [doc_id, ...]}: each question's own evidence documents

Details (``limit``, ``sample``, why one pooled corpus): docs/EVALUATION.md (The QA comparison, step 1).
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memreader.core.errors import ConfigError, MissingInput
from memreader.eval.datasets import (
    DatasetError,
    QARecord,
    load_cmrc2018,
    load_crud_qa,
    load_hotpotqa,
    load_jsonl,
    load_longbench,
)

# name → what the file is
SETS: dict[str, str] = {
    "multifieldqa_zh": "LongBench MultiFieldQA-zh JSONL (_id, input, context, answers): 200 questions, one context each",
    "hotpotqa": "HotpotQA distractor JSON array (_id, question, answer, context, supporting_facts)",
    "cmrc2018": "CMRC 2018 SQuAD-layout JSON (data[].paragraphs[].qas[]); use limit/sample for a subset",
    "crud": "CRUD-RAG split_merged.json QA (questanswer_1doc/2docs/3docs; crud_split picks one)",
    "jsonl": "questions JSONL (id, question, answers, doc_id) over the documents of a memories file",
}


@dataclass
class EvalSet:
    """Questions, the corpus they are answered from, and which documents belong to which question."""

    name: str
    path: str
    questions: list[QARecord]
    documents: dict[str, str]
    question_docs: dict[str, list[str]] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """Plain-JSON summary for the run's summary.json."""
        chars = [len(t) for t in self.documents.values()]
        return {"name": self.name, "path": self.path, "n_questions": len(self.questions),
                "n_documents": len(self.documents), "corpus_chars": sum(chars),
                "mean_document_chars": round(sum(chars) / max(len(chars), 1), 1)}


def _select(records: list[QARecord], limit: int, sample: int, seed: int) -> list[QARecord]:
    if limit and sample:
        raise ValueError("give limit (the first N questions) or sample (N drawn at random), not both")
    if sample:
        if sample > len(records):
            raise ValueError(f"sample={sample} is more than the {len(records)} questions in the set; lower it")
        picked = sorted(random.Random(seed).sample(range(len(records)), sample))
        return [records[i] for i in picked]
    return records[:limit or None]


def _pool(path: str | Path, records: list[QARecord]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Every question's documents pooled once; an id reused for another text gets a content suffix."""
    documents: dict[str, str] = {}
    question_docs: dict[str, list[str]] = {}
    for r in records:
        if not r.documents:
            raise DatasetError(path, f"question {r.id!r} has no evidence documents; this set needs them to build "
                               "the corpus (use dataset=jsonl with a memories file for questions without documents)")
        ids = []
        for p in r.documents:
            doc_id = p.id or hashlib.sha256(p.text.encode()).hexdigest()[:12]
            if doc_id in documents and documents[doc_id] != p.text:
                doc_id = f"{doc_id}#{hashlib.sha256(p.text.encode()).hexdigest()[:8]}"
            documents.setdefault(doc_id, p.text)
            ids.append(doc_id)
        question_docs[r.id] = ids
    return documents, question_docs


def _check_answers(path: str | Path, records: list[QARecord]) -> None:
    empty = [r.id for r in records if not any(a.strip() for a in r.answers)]
    if empty:
        raise DatasetError(path, f"{len(empty)} question(s) have no reference answer (ids {', '.join(empty[:5])}"
                           f"{', ...' if len(empty) > 5 else ''}); every metric needs one: drop those questions or "
                           "add their answers")
    twice = next((i for i, n in Counter(r.id for r in records).items() if n > 1), None)
    if twice is not None:
        raise DatasetError(path, f"question id {twice!r} occurs twice; ids must be unique")


def load_eval_set(name: str, path: str | Path, *, limit: int = 0, sample: int = 0, seed: int = 0,
                  crud_split: str = "1doc", memories: str | Path = "") -> EvalSet:
    """Load benchmark ``name`` (a key of :data:`SETS`) from ``path`` and pool its corpus."""
    if name not in SETS:
        raise ConfigError(f"unknown dataset {name!r}",
                          "set dataset to one of: " + "; ".join(f"{k} ({v})" for k, v in SETS.items()))
    if not Path(path).is_file():
        raise MissingInput(f"dataset file {path} does not exist ({SETS[name]}); give dataset_path=...")
    if name == "jsonl":
        return _jsonl_set(path, memories, limit, sample, seed)
    loader = {"multifieldqa_zh": load_longbench, "hotpotqa": load_hotpotqa, "cmrc2018": load_cmrc2018,
              "crud": lambda p: load_crud_qa(p, crud_split)}[name]
    records = _select(loader(path), limit, sample, seed)
    if not records:
        raise DatasetError(path, "no questions selected (empty file, or limit/sample 0 of 0)")
    _check_answers(path, records)
    documents, question_docs = _pool(path, records)
    return EvalSet(name, str(path), records, documents, question_docs)


def _jsonl_set(path: str | Path, memories: str | Path, limit: int, sample: int, seed: int) -> EvalSet:
    """Questions JSONL whose optional ``doc_id`` names a document of the memories file (the demo layout)."""
    from memreader.core.schema import read_memories

    if not memories or not Path(memories).is_file():
        raise MissingInput(f"dataset=jsonl takes its documents from a memories file; memories={memories!r} does "
                                "not exist (run `memreader read` first, or give memories=...)")
    documents = {m.doc_id: m.document for m in read_memories(memories)}
    records = _select(load_jsonl(path), limit, sample, seed)
    _check_answers(path, records)
    question_docs = {}
    for r in records:
        doc = r.meta.get("doc_id")
        if doc is not None and str(doc) not in documents:
            raise DatasetError(path, f"question {r.id!r}: doc_id {doc!r} is not a document of {memories}")
        question_docs[r.id] = [str(doc)] if doc is not None else []
    return EvalSet("jsonl", str(path), records, documents, question_docs)


def write_corpus(eset: EvalSet, out: str | Path) -> Path:
    """The pooled corpus as a reading corpus JSONL (``{"id", "text"}`` per line), e.g. for ``memreader read``
    on a GPU before ``memreader eval --set memories=...``."""
    from memreader.core.paths import write_jsonl

    return write_jsonl(Path(out), [{"id": doc_id, "text": text} for doc_id, text in eset.documents.items()])


def main(argv: list[str] | None = None) -> int:
    """``python -m memreader.eval.suites DATASET FILE OUT.jsonl [--limit N]``: write a set's pooled corpus for reading."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m memreader.eval.suites", description=main.__doc__)
    parser.add_argument("dataset", choices=[k for k in SETS if k != "jsonl"])
    parser.add_argument("path", help="the dataset file")
    parser.add_argument("out", help="corpus JSONL to write")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--sample", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--crud-split", default="1doc")
    args = parser.parse_args(argv)
    eset = load_eval_set(args.dataset, args.path, limit=args.limit, sample=args.sample, seed=args.seed,
                         crud_split=args.crud_split)
    print(f"{write_corpus(eset, args.out)}: {len(eset.documents)} documents of {len(eset.questions)} questions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
