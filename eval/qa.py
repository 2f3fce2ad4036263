"""RAG question answering over memories vs chunking baselines, scored with BLEU / ROUGE-L / METEOR.

    memreader eval --config configs/eval/demo_qa.yaml --set memories=<run>/read/memories.jsonl
    python -m eval.qa --config configs/eval/demo_qa.yaml

For every system (MemReader memories, plus each baseline chunker over the same documents) the
chunks are indexed in Milvus Lite, the top-k chunks are retrieved per question, an instruct LM
answers from them, and the answers are scored against the references with :mod:`eval.metrics`.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.baselines import baseline_memories
from eval.datasets import QARecord, load_jsonl
from eval.score import format_table, score_pairs
from memreader.config import add_config_arguments, field, load_config, stage_main
from memreader.generation import GenerationParams, make_chat
from memreader.paths import run_dir, write_json, write_resolved_config
from memreader.prompts import detect_lang, render
from memreader.registry import load_embedder
from memreader.schema import DocumentMemory, read_memories
from retrieval.index import MemoryIndex

_INPUTS = (("memories", "run `memreader read` first"), ("qa", "a JSONL of id/question/answers per line"))


@dataclass
class QAConfig:
    """Settings of one QA evaluation."""

    memories: str = field("", help="MemReader memories JSONL (from memreader read)")
    qa: str = field("", help="questions JSONL: {'id', 'question', 'answers': [..]} per line")
    baselines: list[str] = field(["fixed-180"], help="chunking baselines to compare against (eval/baselines.py)")
    run: str = field("eval", help="outputs go to $MEMREADER_HOME/runs/<run>/eval/")
    answer_model: str = field("smollm2-135m-instruct", help="instruct LM that answers (paper: Qwen2.5-7B/14B)")
    answer_backend: str = field("local", help="'local' (transformers) or 'openai' (HTTP endpoint)")
    base_url: str = field("", help="for answer_backend=openai")
    embedder: str = field("minilm-l6", help="sentence-transformers model for the index (paper: bge-base-zh-v1.5)")
    top_k: int = field(8, ge=1, help="chunks retrieved per question (paper: 8)")
    mode: str = field("three_layer", help="retrieval mode for MemReader memories: three_layer | single | chunk_only")
    max_new_tokens: int = field(64, ge=1, help="answer length budget")
    batch_size: int = field(4, ge=1, help="questions per generate call")
    profile: str = field("mom", help="metric profile (eval/metrics.py): mom | crud")
    limit: int = field(0, ge=0, help="only the first N questions (0 = all)")

    def check(self) -> list[str]:
        """Problems beyond types."""
        problems = [f"{key}: required ({hint})" for key, hint in _INPUTS if not getattr(self, key)]
        if self.top_k < 1:
            problems.append("top_k must be >= 1")
        return problems


def _answer_all(answerer: Any, questions: list[QARecord], contexts: list[list[str]], max_new_tokens: int) -> list[str]:
    prompts = []
    for q, chunks in zip(questions, contexts, strict=True):
        context = "\n\n".join(f"[{i + 1}] {c}" for i, c in enumerate(chunks))
        msgs, _ = render("qa_answer", detect_lang(q.question), context=context, question=q.question)
        prompts.append(msgs)
    params = GenerationParams(temperature=0.0, top_p=1.0, max_new_tokens=max_new_tokens)
    return [str(a).strip() for a in answerer.generate_many(prompts, params, progress_desc="answer")]


def evaluate_system(
    name: str, memories: list[DocumentMemory], questions: list[QARecord], cfg: QAConfig,
    embedder: Any, answerer: Any, out_dir: Path,
) -> dict[str, Any]:
    """Index one system's memories, retrieve, answer and score; writes predictions JSONL."""
    mode = cfg.mode if name == "memreader" else "chunk_only"
    t0 = time.perf_counter()
    with MemoryIndex(out_dir / f"{name}.db", embedder=embedder) as index:
        index.build(memories, embedder, embedder_name=cfg.embedder, progress=False)
        hits = [index.search(q.question, top_k=cfg.top_k, mode=mode) for q in questions]
    contexts = [[h.text for h in hs] for hs in hits]
    answers = _answer_all(answerer, questions, contexts, cfg.max_new_tokens)
    report = score_pairs(answers, [q.answers for q in questions], profile=cfg.profile, ids=[q.id for q in questions])
    with (out_dir / f"predictions.{name}.jsonl").open("w", encoding="utf-8") as fh:
        for q, a, hs in zip(questions, answers, hits, strict=True):
            fh.write(json.dumps({"id": q.id, "question": q.question, "prediction": a, "answers": q.answers,
                                 "retrieved": [h.to_dict() for h in hs]}, ensure_ascii=False) + "\n")
    n_chunks = sum(len(m.scenarios) for m in memories)
    return {
        "system": name,
        "mode": mode,
        "chunks": n_chunks,
        "mean_chunk_chars": round(sum(len(m.document) for m in memories) / max(n_chunks, 1), 1),
        "mean_context_chars": round(sum(sum(map(len, c)) for c in contexts) / max(len(contexts), 1), 1),
        "seconds": round(time.perf_counter() - t0, 1),
        "scores": report.to_dict(),
        "_report": report,
    }


def run_qa(cfg: QAConfig, embedder: Any | None = None) -> dict[str, Any]:
    """Evaluate MemReader memories and every baseline on the same questions (``embedder``: an
    already-loaded ``cfg.embedder`` model, to avoid loading it again)."""
    missing = [f"{key}: {getattr(cfg, key)} does not exist ({hint})" for key, hint in _INPUTS
               if not Path(getattr(cfg, key)).is_file()]
    if missing:
        raise FileNotFoundError("; ".join(missing))
    out_dir = run_dir(cfg.run, "eval")
    write_resolved_config(out_dir, cfg)
    memories = read_memories(cfg.memories)
    questions = load_jsonl(cfg.qa)[: cfg.limit or None]
    documents = {m.doc_id: m.document for m in memories}
    embedder = embedder or load_embedder(cfg.embedder)
    if cfg.answer_backend == "openai":
        answerer = make_chat("openai", model=cfg.answer_model, base_url=cfg.base_url or None, env_prefix="MEMREADER_QA")
    else:
        answerer = make_chat("local", model_name=cfg.answer_model, batch_size=cfg.batch_size)
    systems = [("memreader", memories)] + [(b, baseline_memories(b, documents)) for b in cfg.baselines]
    results = [evaluate_system(n, m, questions, cfg, embedder, answerer, out_dir) for n, m in systems]
    table = format_table({r["system"]: r.pop("_report") for r in results})
    provenance = {name: memory_provenance(mems) for name, mems in systems}
    for r in results:
        r["memories"] = provenance[r["system"]]
    table += "\n" + "\n".join(f"{name}: {_provenance_line(p)}" for name, p in provenance.items())
    settings = (f"questions={len(questions)} top_k={cfg.top_k} answer_model={cfg.answer_model} "
                f"embedder={cfg.embedder} profile={cfg.profile}")
    report = {"settings": settings, "systems": results}
    write_json(out_dir / "report.json", report)
    (out_dir / "report.txt").write_text(settings + "\n" + table + "\n", encoding="utf-8")
    print(settings)
    print(table)
    print(f"eval: {len(systems)} systems x {len(questions)} questions → {out_dir / 'report.json'}")
    return report


def memory_provenance(memories: list[Any]) -> dict[str, int]:
    """How each system's memories were made: guided, unguided, whole-document fallbacks, truncated
    (kept flagged), or built by a chunking baseline (no model)."""
    counts = {"memories": len(memories), "guided": 0, "unguided": 0, "fallback": 0, "truncated": 0, "baseline": 0}
    for m in memories:
        gen = m.meta.get("generation")
        if gen is None:
            counts["baseline" if "baseline" in m.meta or "chunker" in m.meta else "unguided"] += 1
        else:
            counts["guided" if gen.get("guided") else "unguided"] += 1
        counts["fallback"] += "fallback" in m.meta
        counts["truncated"] += bool(m.meta.get("truncated"))
    return counts


def _provenance_line(p: dict[str, int]) -> str:
    return (f"{p['memories']} memories: {p['guided']} guided, {p['unguided']} unguided, {p['fallback']} "
            f"whole-document fallbacks, {p['truncated']} truncated (flagged), {p['baseline']} from a chunker")


CONFIG_CLASS = QAConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of this stage's subcommand."""
    add_config_arguments(parser, "configs/eval/")


def run(args: argparse.Namespace) -> int:
    """Entry point behind the CLI."""
    run_qa(load_config(QAConfig, args.config, args.set))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m`` entry point."""
    return stage_main(__doc__, QAConfig, run, argv, "configs/eval/")


if __name__ == "__main__":
    raise SystemExit(main())
