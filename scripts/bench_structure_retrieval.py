"""Benchmark: segmentation tied to retrieval. Supporting-passage recall@k of the HotpotQA dev questions, searched
over each method's chunks of the concatenated gold dev documents, methods side by side.

    .venv/bin/python scripts/bench_structure_retrieval.py --gold artifacts/datasets/structure/dev.jsonl \\
        --manifest artifacts/datasets/structure/manifest.json --qa ../shared/datasets/hotpotqa_100_qa.json \\
        --method fixed=artifacts/runs/seg-rules/segmentation/methods/fixed/memories.jsonl \\
        --method sentence=artifacts/runs/seg-rules/segmentation/methods/sentence/memories.jsonl \\
        --out artifacts/bench/structure_retrieval.json

The English ``hotpotqa`` records of the gold file (``memreader structure-data``) partition every usable
paragraph of the 40 dev questions (manifest ``dev_questions``) into documents of 3-5 paragraphs, each section
titled by its paragraph's title. Each ``--method NAME=memories.jsonl`` (the first is the ratio baseline) must hold
every one of those documents, matched by ``doc_id``, with exactly the gold text. Its chunks (the chunk text only,
no outline or core, so every method is judged on its cuts alone; ``--with-outline`` adds rows with the scenario's
outline prepended, for methods that write one) are embedded with the embedded MiniLM (``minilm-l6``) and every
question gets an exact cosine top-k over all chunks of that method. Exact numpy search rather than Milvus: a flat
exhaustive search isolates the segmentation from any index approximation.

A supporting title (present in the corpus: paragraphs too short to be used are absent, and counted) is retrieved at
k when one of the top-k chunks overlaps its passage span by at least min(--min-overlap, half the passage)
characters. Printed per method and k: mean recall over the questions (95% percentile bootstrap interval, seeded),
the rate of questions with every present supporting title found, and the mean retrieved characters beside the mean
chunk length (a method with huge chunks covers more trivially), then every method's ratio to the first and the
signature. ``--out`` writes all of it as JSON, with each question's first hit rank per title.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from _common import method_file

from memreader.core.embedders import EMBED_BATCH, encode
from memreader.core.errors import MemReaderError
from memreader.core.paths import sha256_file, write_json
from memreader.core.registry import MINILM
from memreader.core.schema import read_memories
from memreader.eval.datasets import load_hotpotqa
from memreader.eval.stats import DEFAULT_RESAMPLES, DEFAULT_SEED, bootstrap_cis

VERSION = "1.0"  # bump when a definition below changes; part of the signature


class BenchError(MemReaderError, ValueError):
    """An input of the benchmark does not fit the others."""


@dataclass(frozen=True)
class Span:
    """A character span of one document: a gold passage or a method's chunk."""

    doc_id: str
    start: int
    end: int


@dataclass(frozen=True)
class Question:
    """A dev question and its distinct supporting titles, split into those in the corpus and those absent."""

    id: str
    question: str
    present: tuple[str, ...]
    absent: tuple[str, ...]


def load_gold(path: Path) -> tuple[dict[str, str], dict[str, Span]]:
    """The English hotpotqa gold documents (id -> text) and each paragraph title's passage span (joining space
    left out)."""
    texts: dict[str, str] = {}
    spans: dict[str, Span] = {}
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec.get("source") != "hotpotqa" or rec.get("lang") != "en":
                continue
            if "".join(s["text"] for s in rec["sections"]) != rec["text"]:
                raise BenchError(f"{path}:{lineno}: the sections of {rec['id']!r} do not concatenate to its text; "
                                 "rebuild it with memreader structure-data")
            texts[rec["id"]] = rec["text"]
            pos = 0
            for sec in rec["sections"]:
                title = sec["title"]
                if title in spans:
                    raise BenchError(f"{path}:{lineno}: title {title!r} is in two sections; each paragraph must "
                                     "appear once")
                spans[title] = Span(rec["id"], pos, pos + len(sec["text"].rstrip()))
                pos += len(sec["text"])
    if not texts:
        raise BenchError(f"{path} has no English records with source 'hotpotqa'; pass the structure dev file")
    return texts, spans


def load_questions(qa_path: Path, manifest_path: Path, spans: dict[str, Span],
                   key: str = "dev_questions") -> list[Question]:
    """The manifest's dev questions, with supporting titles split by presence in the corpus."""
    records = load_hotpotqa(qa_path)
    indices = json.loads(manifest_path.read_text(encoding="utf-8")).get(key)
    if not isinstance(indices, list) or not indices:
        raise BenchError(f"{manifest_path} has no {key!r} list; pass the manifest of the gold file")
    bad = [i for i in indices if not isinstance(i, int) or not 0 <= i < len(records)]
    if bad:
        raise BenchError(f"{manifest_path}: dev_questions {bad[:5]} are not indices into the {len(records)} "
                         f"questions of {qa_path}; pass the QA file the manifest was built from")
    out = []
    for i in indices:
        rec = records[i]
        titles = list(dict.fromkeys(str(f[0]) for f in rec.meta["supporting_facts"]))
        out.append(Question(rec.id, rec.question, tuple(t for t in titles if t in spans),
                            tuple(t for t in titles if t not in spans)))
    return out


def method_chunks(name: str, path: Path, texts: dict[str, str], with_outline: bool = False
                  ) -> tuple[list[Span], list[str]]:
    """A method's chunk spans over the gold documents and the texts to embed (outline + newline + chunk when
    ``with_outline``); errors name the method and the first bad document."""
    mems = {m.doc_id: m for m in read_memories(path)}
    missing = [d for d in texts if d not in mems]
    if missing:
        raise BenchError(f"method {name!r} ({path}) lacks {len(missing)} of the {len(texts)} hotpotqa gold "
                         f"documents (first: {missing[0]!r}); read every document of the gold file")
    spans, embed = [], []
    for doc_id, text in texts.items():
        mem = mems[doc_id]
        if mem.document != text:
            at = next((i for i, (a, b) in enumerate(zip(mem.document, text, strict=False)) if a != b),
                      min(len(mem.document), len(text)))
            raise BenchError(f"method {name!r} ({path}): document {doc_id!r} differs from the gold text at "
                             f"character {at}; make the memories from this gold file")
        for s in mem.scenarios:
            spans.append(Span(doc_id, s.start, s.end))
            chunk = text[s.start : s.end]
            embed.append(f"{s.outline.strip()}\n{chunk}" if with_outline and s.outline.strip() else chunk)
    return spans, embed


def has_outline(path: Path) -> bool:
    """Whether any scenario of the memories file has a non-empty outline item."""
    return any(s.outline.strip() for m in read_memories(path) for s in m.scenarios)


def overlap(a: Span, b: Span) -> int:
    """Characters two spans share (0 across documents)."""
    return max(0, min(a.end, b.end) - max(a.start, b.start)) if a.doc_id == b.doc_id else 0


def is_hit(chunk: Span, passage: Span, min_overlap: int = 100) -> bool:
    """A chunk retrieves a passage when they share at least min(min_overlap, half the passage) characters."""
    return overlap(chunk, passage) >= min(min_overlap, (passage.end - passage.start) / 2)


def first_hits(order: np.ndarray, chunks: list[Span], passages: dict[str, Span], titles: tuple[str, ...],
               min_overlap: int = 100) -> dict[str, int | None]:
    """For each title, the 0-based rank of the first chunk in ``order`` that retrieves its passage."""
    out: dict[str, int | None] = {}
    for t in titles:
        out[t] = next((r for r, i in enumerate(order) if is_hit(chunks[i], passages[t], min_overlap)), None)
    return out


def score_method(chunks: list[Span], chunk_vecs: np.ndarray, query_vecs: np.ndarray, questions: list[Question],
                 passages: dict[str, Span], ks: list[int], min_overlap: int, n_resamples: int, seed: int
                 ) -> dict[str, Any]:
    """Recall@k (mean, bootstrap interval), all-found@k and retrieved chars@k over the scored questions."""
    sims = query_vecs @ chunk_vecs.T  # unit vectors: cosine
    lengths = np.array([c.end - c.start for c in chunks], dtype=float)
    recall = np.zeros((len(questions), len(ks)))
    full = np.zeros_like(recall)
    chars = np.zeros_like(recall)
    per_question = []
    for qi, q in enumerate(questions):
        order = np.argsort(-sims[qi], kind="stable")
        ranks = first_hits(order, chunks, passages, q.present, min_overlap)
        for ki, k in enumerate(ks):
            found = sum(r is not None and r < k for r in ranks.values())
            recall[qi, ki] = found / len(q.present)
            full[qi, ki] = float(found == len(q.present))
            chars[qi, ki] = lengths[order[:k]].sum()
        per_question.append({"id": q.id, "first_hit_rank": ranks, "top": [int(i) for i in order[: max(ks)]]})
    cis = bootstrap_cis(recall, n_resamples=n_resamples, seed=seed)
    return {
        "n_chunks": len(chunks), "mean_chunk_chars": round(float(lengths.mean()), 1),
        "recall": {str(k): round(float(recall[:, i].mean()), 4) for i, k in enumerate(ks)},
        "recall_ci": {str(k): [round(cis[i].low, 4), round(cis[i].high, 4)] for i, k in enumerate(ks)},
        "all_found": {str(k): round(float(full[:, i].mean()), 4) for i, k in enumerate(ks)},
        "retrieved_chars": {str(k): round(float(chars[:, i].mean()), 1) for i, k in enumerate(ks)},
        "questions": per_question,
    }


def signature(ks: list[int], min_overlap: int, embedder: str, n_questions: int, n_titles: int, n_resamples: int,
              seed: int, with_outline: bool) -> str:
    """Every setting behind the numbers, sacrebleu style."""
    return (f"SupportRecall|k:{','.join(map(str, ks))}|hit:overlap>=min({min_overlap},half-passage)|"
            f"emb:{embedder}|search:exact-cosine|text:chunk{'+outline-rows' if with_outline else ''}|"
            f"questions:{n_questions}|titles:{n_titles}|bootstrap:{n_resamples}|seed:{seed}|mr-sr:{VERSION}")


def _ratio(value: float, base: float) -> float | None:
    return round(value / base, 3) if base else None


def format_tables(results: dict[str, dict[str, Any]], ks: list[int]) -> str:
    """The recall, all-found and retrieved-chars tables, then the ratios to the first method."""
    head = f"{'method':<20}{'chunks':>7}{'chars/chunk':>12}"
    lines = ["recall@k: mean over questions [95% CI]",
             head + "".join(f"{f'k={k}':>22}" for k in ks)]
    for name, r in results.items():
        cells = "".join(f"{r['recall'][str(k)]:>8.3f} [{r['recall_ci'][str(k)][0]:.3f},{r['recall_ci'][str(k)][1]:.3f}]"
                        for k in ks)
        lines.append(f"{name:<20}{r['n_chunks']:>7}{r['mean_chunk_chars']:>12.1f}{cells}")
    for key, title, fmt in (("all_found", "all supporting titles found@k", ".3f"),
                            ("retrieved_chars", "mean retrieved chars@k", ".0f")):
        lines += ["", title, f"{'method':<20}" + "".join(f"{f'k={k}':>10}" for k in ks)]
        lines += [f"{name:<20}" + "".join(f"{r[key][str(k)]:>10{fmt}}" for k in ks) for name, r in results.items()]
    base_name = next(iter(results))
    base = results[base_name]
    cols = [("chars/chunk", "mean_chunk_chars", None)] + [(f"R@{k}", "recall", k) for k in ks] + \
        [(f"all@{k}", "all_found", k) for k in ks] + [(f"chars@{k}", "retrieved_chars", k) for k in ks]
    lines += ["", f"ratio to {base_name}", f"{'method':<20}" + "".join(f"{c:>12}" for c, _, _ in cols)]
    for name, r in results.items():
        cells = []
        for _, key, k in cols:
            v, b = (r[key], base[key]) if k is None else (r[key][str(k)], base[key][str(k)])
            ratio = _ratio(v, b)
            cells.append(f"{'-' if ratio is None else f'{ratio:.3f}':>12}")
        lines.append(f"{name:<20}" + "".join(cells))
    return "\n".join(lines)


def _ks(value: str) -> list[int]:
    try:
        ks = sorted({int(v) for v in value.split(",") if v.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: give positive integers separated by commas, e.g. 1,3,5,10") \
            from None
    if not ks or ks[0] < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: give positive integers separated by commas, e.g. 1,3,5,10")
    return ks


def main(argv: list[str] | None = None, embedder: Any = None) -> int:
    """Parse the arguments, search every method's chunks, print the tables and write the JSON (``embedder``:
    an object with ``encode_query``/``encode_document``, for tests; default: load ``--embedder``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gold", type=Path, default=Path("artifacts/datasets/structure/dev.jsonl"),
                    help="structure dev or test JSONL (memreader structure-data)")
    ap.add_argument("--questions", default="dev_questions", choices=("dev_questions", "test_questions"),
                    help="which questions of the manifest: the dev split's or the test split's")
    ap.add_argument("--manifest", type=Path, default=Path("artifacts/datasets/structure/manifest.json"),
                    help="its manifest.json (dev_questions: indices into --qa)")
    ap.add_argument("--qa", type=Path, default=Path("../shared/datasets/hotpotqa_100_qa.json"),
                    help="HotpotQA-100 questions (distractor layout)")
    ap.add_argument("--method", action="append", type=method_file, required=True, metavar="NAME=MEMORIES",
                    help="a method's memories of the gold texts; repeat per method (the first is the ratio baseline)")
    ap.add_argument("--k", type=_ks, default=[1, 3, 5, 10], help="cut-offs, comma-separated (default 1,3,5,10)")
    ap.add_argument("--min-overlap", type=int, default=100,
                    help="a hit shares at least min(this, half the passage) characters with it (default 100)")
    ap.add_argument("--with-outline", action="store_true",
                    help="also score NAME+outline rows: outline + chunk embedded, for methods with outlines")
    ap.add_argument("--embedder", default=MINILM, help=f"embedder name (default {MINILM})")
    ap.add_argument("--device", default="auto", help="embedder device (default auto)")
    ap.add_argument("--batch-size", type=int, default=EMBED_BATCH, help=f"encoding batch size (default {EMBED_BATCH})")
    ap.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES, help="bootstrap resamples (default 1000)")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"bootstrap seed (default {DEFAULT_SEED})")
    ap.add_argument("--out", type=Path, help="write the comparison as JSON here")
    args = ap.parse_args(argv)
    names = [n for n, _ in args.method]
    if len(set(names)) != len(names):
        ap.error(f"a method name is given twice: {names}")
    for p, flag in ((args.gold, "--gold"), (args.manifest, "--manifest"), (args.qa, "--qa")):
        if not p.is_file():
            ap.error(f"{flag} {p} does not exist")
    try:
        return run(args, embedder)
    except MemReaderError as exc:  # bad inputs: one clear line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace, embedder: Any = None) -> int:
    """The benchmark itself, on parsed arguments (see :func:`main`)."""
    names = [n for n, _ in args.method]

    # --- data: gold passages, dev questions ---
    t0 = time.perf_counter()
    texts, passages = load_gold(args.gold)
    all_questions = load_questions(args.qa, args.manifest, passages, args.questions)
    questions = [q for q in all_questions if q.present]
    n_titles = sum(len(q.present) for q in questions)
    n_absent = sum(len(q.absent) for q in all_questions)
    if not questions:
        raise BenchError("no dev question has a supporting title in the gold corpus; check --gold and --manifest")
    print(f"gold: {args.gold}: {len(texts)} hotpotqa documents, {len(passages)} passages; {len(all_questions)} dev "
          f"questions, {len(questions)} scored ({len(all_questions) - len(questions)} with no supporting title in "
          f"the corpus), {n_titles} supporting titles present, {n_absent} absent (paragraphs too short to use)")

    # --- embed: queries once, every method's chunks ---
    if embedder is None:
        from memreader.core.runtime import load_embedder

        embedder = load_embedder(args.embedder, args.device)
    query_vecs = encode(embedder, [q.question for q in questions], args.batch_size, kind="query")
    runs = [(n, p, False) for n, p in args.method]
    if args.with_outline:
        runs += [(f"{n}+outline", p, True) for n, p in args.method if has_outline(p)]
    results: dict[str, dict[str, Any]] = {}
    for name, path, outline in runs:
        t1 = time.perf_counter()
        chunks, embed_texts = method_chunks(name, path, texts, outline)
        vecs = encode(embedder, embed_texts, args.batch_size, kind="document")
        results[name] = {"memories": str(path), "sha256": sha256_file(path), "outline": outline,
                         **score_method(chunks, vecs, query_vecs, questions, passages, args.k, args.min_overlap,
                                        args.resamples, args.seed)}
        results[name]["seconds"] = round(time.perf_counter() - t1, 2)
        print(f"{name}: {len(chunks)} chunks embedded and searched in {results[name]['seconds']:.1f} s", flush=True)

    # --- report ---
    sig = signature(args.k, args.min_overlap, args.embedder, len(questions), n_titles, args.resamples, args.seed,
                    args.with_outline)
    print(format_tables(results, args.k))
    print(sig)
    seconds = time.perf_counter() - t0
    if args.out:
        write_json(args.out, {
            "gold": {"path": str(args.gold), "sha256": sha256_file(args.gold), "n_docs": len(texts),
                     "n_passages": len(passages)},
            "qa": {"path": str(args.qa), "manifest": str(args.manifest), "n_dev_questions": len(all_questions),
                   "n_scored": len(questions), "n_titles_present": n_titles, "n_titles_absent": n_absent,
                   "unscored": [q.id for q in all_questions if not q.present]},
            "settings": {"k": args.k, "min_overlap": args.min_overlap, "embedder": args.embedder,
                         "with_outline": args.with_outline, "resamples": args.resamples, "seed": args.seed},
            "signature": sig, "baseline": names[0],
            "ratios": {n: {key: {str(k): _ratio(r[key][str(k)], results[names[0]][key][str(k)]) for k in args.k}
                           for key in ("recall", "all_found", "retrieved_chars")} for n, r in results.items()},
            "methods": results, "seconds": round(seconds, 2),
        })
        print(f"wrote {args.out}")
    print(f"{len(results)} methods x {len(questions)} questions in {seconds:.1f} s "
          f"({len(results) * len(questions) / seconds:.1f} question searches/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
