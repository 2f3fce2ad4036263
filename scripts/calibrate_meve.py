"""Choose MeVe's verifier and operating point by measurement on HotpotQA, checked on questions it never saw.

    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python scripts/calibrate_meve.py \\
        --qa ../shared/datasets/hotpotqa_100_qa.json --corpus ../shared/datasets/hotpotqa_100_corpus.json

The corpus goes into one PassageStore as in ``scripts/bench_meve.py`` (one passage per paragraph). The questions are
split in two halves, ``--calibrate`` (default 0:50) and ``--check`` (50:100), and each half chooses once and is
checked once (two-fold cross-validation), so every reported "out-of-fold" number comes from questions the point
was not chosen on. Verifiers:

- ``embedding``: phase 1's cosine (no model call);
- ``lm``: SmolLM2's normalised P(yes); ``lm_likelihood``: how much the passage raises log P(question) (UPR);

each with the calibrations of :mod:`memreader.retrieval.verifier_calibration`: ``none``, ``content_free`` (LM kinds) and
``query``. The LM kinds score every (question, candidate) once plus the content-free passage, through the engine
``--backend`` (default auto: vLLM bf16 here), and the three calibrations are derived from those raw scores (kept in
``scores.json`` and reused while nothing they depend on changed). ``off`` (no verification: the budget alone) is
swept too, as the reference a verifier has to beat.

For every variant and half: tau over ``--grid`` quantiles of its own scores x t_max in ``--t-max`` (512 768 1024);
the point with the fewest mean tokens whose supporting recall beats plain top-5's on that half by at least ``--z``
(1) standard errors of the paired difference is chosen (retrieval/meve_calibration.py), then run unchanged on the
other half. A variant passes when, out of fold over all questions, its recall is at least top-5's and its tokens at
least 57 % fewer than top-20's. The pick, by a rule fixed before the run: the passing variant with the fewest
out-of-fold tokens; among those within 5 % of it, the cheapest verifier. None passes: it says so and picks nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _common import hotpot_passages, support_recall, top_k_run
from tqdm import tqdm

from memreader.core.config import load_config
from memreader.core.paths import memreader_home, sha256_file, write_json
from memreader.core.registry import canonical_name
from memreader.core.runtime import load_embedder
from memreader.eval.datasets import load_hotpotqa
from memreader.retrieval.meve import MeVePipeline, MeVeSettings, load_tokenizer
from memreader.retrieval.meve_calibration import CalibrationError, Calibrator, as_rows, choose, tau_grid
from memreader.retrieval.passages import PassageStore
from memreader.retrieval.search import RetrievalConfig
from memreader.retrieval.verifier import build_verifier, sigmoid
from memreader.retrieval.verifier_calibration import CONTENT_FREE, EmbeddingVerifier, calibrated_margins

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "retrieval" / "meve_hotpotqa.yaml"
LM_KINDS = ("lm", "lm_likelihood")
CALIBRATIONS = {"embedding": ("none", "query"), "lm": ("none", "content_free", "query"),
                "lm_likelihood": ("none", "content_free", "query")}
NEAR_BEST = 0.05
GOAL_REDUCTION = 0.57


def derive(kind: str, raw: list[float], base: float | None) -> dict[str, list[float]]:
    """The scores of every calibration of ``kind`` from its raw scores (and the content-free one)."""
    scores = {mode: [sigmoid(x) for x in calibrated_margins(mode, raw, base)] for mode in CALIBRATIONS[kind]}
    if kind == "embedding":  # the embedding verifier's own score is the clipped cosine, not its sigmoid
        scores["none"] = EmbeddingVerifier().score("-", ["-"] * len(raw), similarities=raw)
    return scores


def top_k(store: PassageStore, embedder: Any, tokenizer: Any, questions: list[str], k: int) -> tuple[list, float]:
    """Plain dense top-k doc_ids per question and mean tokens of the joined passages (bench_meve's runs)."""
    runs = [top_k_run(store, embedder, tokenizer, q, k) for q in questions]
    return [r["doc_ids"] for r in runs], statistics.fmean(r["tokens"] for r in runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qa", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--config", default=str(CONFIG))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--calibrate", default="0:50", help="question slice that chooses (default %(default)s)")
    ap.add_argument("--check", default="50:100", help="question slice that only reports (default %(default)s)")
    ap.add_argument("--t-max", type=int, nargs="+", default=[512, 768, 1024])
    ap.add_argument("--kinds", nargs="+", default=["embedding", *LM_KINDS], choices=["embedding", *LM_KINDS])
    ap.add_argument("--backend", default="auto", help="LM verifiers' engine: transformers, vllm or auto")
    ap.add_argument("--grid", type=int, default=16, help="tau values per verifier: quantiles of its scores")
    ap.add_argument("--z", type=float, default=1.0, help="standard errors of the paired recall difference to spare "
                    "(retrieval/meve_calibration.py: choose)")
    ap.add_argument("--db", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    def piece(spec: str) -> slice:
        lo, hi = (int(x) for x in spec.split(":"))
        return slice(lo, hi)

    records = load_hotpotqa(args.qa)
    splits = {"calibrate": records[piece(args.calibrate)], "check": records[piece(args.check)]}
    if {r.id for r in splits["calibrate"]} & {r.id for r in splits["check"]}:
        raise SystemExit("calibrate_meve: the calibration and check slices overlap; the check must be unseen")
    cfg = load_config(RetrievalConfig, args.config, args.set)
    base = MeVeSettings(**cfg.meve_settings())
    embedder_name = canonical_name(cfg.embedder)
    embedder = load_embedder(embedder_name, device=cfg.device)
    tokenizer = load_tokenizer(base.budget_tokenizer)
    out_dir = memreader_home() / "runs" / "calibrate-meve"
    db = Path(args.db) if args.db else out_dir / "passages.db"
    passages = hotpot_passages(args.corpus)
    stamp = db.with_name(db.name + ".source.json")  # the corpus and embedder the store was built from
    source = {"corpus_sha256": sha256_file(args.corpus), "embedder": embedder_name, "passages": len(passages)}
    if db.exists() and stamp.is_file() and json.loads(stamp.read_text()) == source:
        print(f"reusing {db} (built from the same corpus and embedder)")
        store = PassageStore.open(db, embedder=embedder, embedder_name=embedder_name)
    else:
        stamp.unlink(missing_ok=True)
        store = PassageStore.create(db, embedder=embedder)
        store.build(passages, embedder, embedder_name=embedder_name, batch_size=64)
        write_json(stamp, source)
    with store:

        def pipeline_for(keys: dict[str, Any], verifier: Any) -> MeVePipeline:
            return MeVePipeline(store, embedder, verifier, tokenizer, MeVeSettings(**{**base.meve_settings(), **keys}))

        calibrators, baselines = {}, {}
        for split, recs in splits.items():
            qs = [r.question for r in recs]
            gold = [{f[0] for f in r.meta["supporting_facts"]} for r in recs]
            calibrators[split] = Calibrator(pipeline_for, qs, gold)
            top5, top5_tokens = top_k(store, embedder, tokenizer, qs, 5)
            _, top20_tokens = top_k(store, embedder, tokenizer, qs, 20)
            per_q = [support_recall(g, d) for g, d in zip(gold, top5, strict=True)]
            baselines[split] = {"top5_recall": statistics.fmean(per_q), "top5_per_question": per_q,
                                "top5_tokens": top5_tokens, "top20_tokens": top20_tokens}
        cost: dict[str, float] = {"embedding": 0.0}
        # raw verifier scores are kept (scores.json beside the store) and reused while the candidates, the verifier
        # and its settings are the same: a new rule or grid then costs no model call
        cache_path = out_dir / "scores.json"
        cache = json.loads(cache_path.read_text()) if cache_path.is_file() else {}
        for kind in args.kinds:
            fingerprint = json.dumps([kind, base.verifier, base.verifier_max_tokens, args.backend, base.verifier_dtype,
                                      embedder_name, source,
                                      {q: cal.texts(q) for cal in calibrators.values() for q in cal.questions}])
            fingerprint = hashlib.sha256(fingerprint.encode()).hexdigest()[:16]
            kept = cache.get(kind) if kind != "embedding" else None
            verifier = None if kind == "embedding" or (kept and kept["fingerprint"] == fingerprint) else \
                build_verifier(kind, base.verifier, device=cfg.device, batch_size=base.verifier_batch_size,
                               max_passage_tokens=base.verifier_max_tokens, backend=args.backend,
                               dtype=base.verifier_dtype)
            per_split: dict[str, dict[str, dict[str, list[float]]]] = {}
            raws: dict[str, list[float]] = {}
            n_scored, started = 0, time.perf_counter()
            for split, cal in calibrators.items():
                scores: dict[str, dict[str, list[float]]] = {}
                for q in tqdm(cal.questions, desc=f"{kind} {split}", unit="question"):
                    if kind == "embedding":
                        raw, base_raw = cal.similarities(q), None
                    elif verifier is None:
                        *raw, base_raw = kept["raw"][q]
                    else:
                        *raw, base_raw = raws[q] = verifier.margins(q, [*cal.texts(q), CONTENT_FREE])
                        n_scored += 1
                    for calibration, values in derive(kind, raw, base_raw).items():
                        scores.setdefault(calibration, {})[q] = values
                per_split[split] = scores
            if verifier is not None:
                cost[kind] = 1000.0 * (time.perf_counter() - started) / max(n_scored, 1)
                engine = getattr(verifier, "choice", {})
                print(f"{kind}: {cost[kind]:.0f} ms per question ({engine.get('backend')}/{engine.get('dtype')})")
                cache[kind] = {"fingerprint": fingerprint, "raw": raws, "ms_per_question": cost[kind],
                               "engine": engine}
                write_json(cache_path, cache)
            elif kind != "embedding":
                cost[kind] = kept["ms_per_question"]
                print(f"{kind}: raw scores reused from {cache_path} ({cost[kind]:.0f} ms per question when measured)")
            for calibration in CALIBRATIONS[kind]:
                for split, cal in calibrators.items():
                    cal.add_scores(f"{kind}/{calibration}", per_split[split][calibration])

        results = []
        variants = ["off"] + [f"{k}/{c}" for k in args.kinds for c in CALIBRATIONS[k]]
        folds = (("calibrate", "check"), ("check", "calibrate"))  # both halves choose once, and are checked once
        for name in tqdm(variants, desc="sweep", unit="verifier"):
            row: dict[str, Any] = {"verifier": name, "ms_per_question": cost.get(name.split("/")[0], 0.0),
                                   "folds": []}
            for fit, held in folds:
                cal = calibrators[fit]
                points = cal.sweep(name, tau_grid(cal.scores[name], n=args.grid) if name != "off" else [0.0],
                                   args.t_max)
                fold: dict[str, Any] = {"fit": fit, "held": held, "points": as_rows(points)}
                try:
                    chosen = choose(points, baselines[fit]["top5_per_question"], z=args.z)
                except CalibrationError as err:
                    fold["error"] = str(err)
                else:
                    checked = calibrators[held].point(name, chosen.tau, chosen.t_max)
                    fold["chosen"], fold["checked"] = as_rows([chosen])[0], as_rows([checked])[0]
                    fold["checked_per_question"] = list(checked.per_question)
                row["folds"].append(fold)
            done = [f for f in row["folds"] if "checked" in f]
            if len(done) == len(folds):  # out of fold: every question judged by the point the other half chose
                row["oof_recall"] = statistics.fmean(x for f in done for x in f["checked_per_question"])
                row["oof_tokens"] = statistics.fmean(f["checked"]["tokens"] for f in done)
            results.append(row)

        top5 = statistics.fmean(x for b in baselines.values() for x in b["top5_per_question"])
        top20 = statistics.fmean(b["top20_tokens"] for b in baselines.values())
        for row in results:
            row["passes"] = ("oof_recall" in row and row["oof_recall"] >= top5 - 1e-12
                             and row["oof_tokens"] <= (1 - GOAL_REDUCTION) * top20)
        print(f"\nhalves {args.calibrate} and {args.check}: top-5 recall {baselines['calibrate']['top5_recall']:.3f} / "
              f"{baselines['check']['top5_recall']:.3f} (both {top5:.3f}), top-20 {top20:.0f} tokens; each half chooses "
              f"(fewest tokens with recall >= its top-5's + {args.z:g} SE), the other half checks")
        print("| verifier | A: tau, t_max | A→B recall, tokens | B: tau, t_max | B→A recall, tokens | out-of-fold recall "
              "| out-of-fold tokens (vs top-20) | passes | verifier ms/q |")
        print("|---|---|---|---|---|---|---|---|---|")
        for row in results:
            cells = []
            for f in row["folds"]:
                if "chosen" in f:
                    c, h = f["chosen"], f["checked"]
                    cells += [f"{c['tau']:.4g}, {c['t_max']}", f"{h['recall']:.3f}, {h['tokens']:.0f}"]
                else:
                    cells += ["no point", f["error"].split("; fix")[0].split("the closest is ")[-1]]
            oof = (f"{row['oof_recall']:.3f}", f"{row['oof_tokens']:.0f} ({100 * (row['oof_tokens'] / top20 - 1):+.1f}%)"
                   ) if "oof_recall" in row else ("—", "—")
            print(f"| {row['verifier']} | {' | '.join(cells)} | {oof[0]} | {oof[1]} | {'yes' if row['passes'] else 'no'} "
                  f"| {row['ms_per_question']:.0f} |")
        passing = [r for r in results if r["passes"]]
        pick = None
        if passing:
            fewest = min(r["oof_tokens"] for r in passing)
            near = [r for r in passing if r["oof_tokens"] <= (1 + NEAR_BEST) * fewest]
            pick = min(near, key=lambda r: (r["ms_per_question"], r["oof_tokens"]))
            print(f"\nrule's pick: {pick['verifier']} (out of fold: recall {pick['oof_recall']:.3f} >= top-5 {top5:.3f}, "
                  f"{pick['oof_tokens']:.0f} tokens = {100 * (1 - pick['oof_tokens'] / top20):.1f}% fewer than top-20)")
            for f in pick["folds"]:
                print(f"  chosen on {f['fit']}: {f['chosen']}")
            # the defaults: the same rule on every question (the out-of-fold numbers above are its honest check;
            # the store stays open: the fallback's BM25 searches it)
            everyone = Calibrator(pipeline_for, [q for c in calibrators.values() for q in c.questions],
                                  [g for c in calibrators.values() for g in c.gold])
            name = pick["verifier"]
            if name != "off":
                everyone.add_scores(name, {q: v for c in calibrators.values() for q, v in c.scores[name].items()})
            points = everyone.sweep(name, tau_grid(everyone.scores[name], n=args.grid) if name != "off" else [0.0],
                                    args.t_max)
            final = choose(points, [x for b in baselines.values() for x in b["top5_per_question"]], z=args.z)
            pick["final"] = as_rows([final])[0]
            where = (f"calibrated by scripts/calibrate_meve.py on HotpotQA-100 ({len(everyone.questions)} questions): "
                     f"{final.describe(top5)}; two-fold out-of-fold check: recall {pick['oof_recall']:.3f}, "
                     f"{pick['oof_tokens']:.0f} tokens")
            print("\nMeVe keys (configs/retrieval/meve_hotpotqa.yaml):")
            for key, value in {**final.settings(), "operating_point": where}.items():
                print(f"  {key}: {json.dumps(value) if isinstance(value, str) else value}")
        else:
            print("\nrule's pick: NONE — no verifier meets both goals out of fold; nothing is chosen (see the table)")
    out = Path(args.out) if args.out else out_dir / "calibration.json"
    write_json(out, {"halves": [args.calibrate, args.check], "baselines": baselines, "top5_recall": top5,
                     "top20_tokens": top20, "t_max": args.t_max, "z": args.z, "grid": args.grid,
                     "rule": f"fewest out-of-fold tokens among passing variants; within {NEAR_BEST:.0%}, cheapest",
                     "results": results, "pick": pick and pick["verifier"], "settings": base.meve_settings()})
    print(f"results -> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
