"""Choose MeVe's verifier and operating point by measurement on HotpotQA, checked on questions it never saw.

    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python scripts/calibrate_meve.py \\
        --qa ../shared/datasets/hotpotqa_100_qa.json --corpus ../shared/datasets/hotpotqa_100_corpus.json

The corpus goes into one PassageStore as in ``scripts/bench_meve.py`` (one passage per paragraph). The questions are
split in two: ``--calibrate`` (default the first 50) chooses, ``--check`` (the other 50) only reports. Verifiers:

- ``embedding``: phase 1's cosine (no model call);
- ``lm``: SmolLM2's normalised P(yes); ``lm_likelihood``: how much the passage raises log P(question) (UPR);

each with the calibrations of :mod:`retrieval.verifier_calibration`: ``none``, ``content_free`` (LM kinds) and
``query``. The LM kinds score every (question, candidate) once plus the content-free passage, through the engine
``--backend`` (default auto: vLLM bf16 here), and the three calibrations are derived from those raw scores. ``off``
(no verification, the budget alone) is swept too, as the reference a verifier has to beat.

For every variant: tau over a grid of its own score quantiles x t_max in ``--t-max`` (default 512 768 1024); the
point with the fewest mean tokens whose supporting recall beats plain top-5's on the calibration questions by at
least ``--z`` (1) standard errors of the paired difference is chosen (retrieval/meve_calibration.py), then run
unchanged on the check questions. The variant the defaults take is
fixed by a rule declared before the run: the fewest calibration tokens; among variants within 5 % of those, the
cheapest verifier. Output: one table (calibration and check columns), the rule's pick as MeVe keys, a JSON file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_meve import passages_of, recall  # noqa: E402

from eval.datasets import load_hotpotqa  # noqa: E402
from memreader.config import load_config  # noqa: E402
from memreader.embedders import encode  # noqa: E402
from memreader.paths import memreader_home, sha256_file, write_json  # noqa: E402
from memreader.registry import canonical_name  # noqa: E402
from memreader.runtime import load_embedder  # noqa: E402
from retrieval.meve import SEPARATOR, MeVePipeline, MeVeSettings, load_tokenizer  # noqa: E402
from retrieval.meve_calibration import CalibrationError, Calibrator, as_rows, choose, tau_grid  # noqa: E402
from retrieval.passages import PassageStore  # noqa: E402
from retrieval.search import RetrievalConfig  # noqa: E402
from retrieval.verifier import _sigmoid, build_verifier  # noqa: E402
from retrieval.verifier_calibration import CONTENT_FREE  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "retrieval" / "meve_hotpotqa.yaml"
LM_KINDS = ("lm", "lm_likelihood")
CALIBRATIONS = {"embedding": ("none", "query"), "lm": ("none", "content_free", "query"),
                "lm_likelihood": ("none", "content_free", "query")}
NEAR_BEST = 0.05


def zscores(raw: list[float]) -> list[float]:
    mean, std = statistics.fmean(raw), max(statistics.pstdev(raw), 1e-6)
    return [_sigmoid((x - mean) / std) for x in raw]


def derive(kind: str, raw: list[float], base: float | None) -> dict[str, list[float]]:
    """The scores of every calibration of ``kind`` from its raw scores (and the content-free one)."""
    if kind == "embedding":
        return {"none": [min(1.0, max(0.0, x)) for x in raw], "query": zscores(raw)}
    return {"none": [_sigmoid(x) for x in raw], "content_free": [_sigmoid(x - base) for x in raw],
            "query": zscores(raw)}


def top_k(store: PassageStore, embedder: Any, tokenizer: Any, questions: list[str], k: int) -> tuple[list, float]:
    """Plain dense top-k doc_ids per question and mean tokens of the joined passages."""
    out, tokens = [], []
    for q in questions:
        hits = store.knn(encode(embedder, [q], batch_size=1, kind="query")[0].tolist(), k, with_vectors=False)
        out.append([h.doc_id for h in hits])
        tokens.append(len(tokenizer(SEPARATOR.join(h.text for h in hits), add_special_tokens=False)["input_ids"]))
    return out, statistics.fmean(tokens)


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
    passages = passages_of(args.corpus)
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
            per_q = [recall(g, d) for g, d in zip(gold, top5, strict=True)]
            baselines[split] = {"top5_recall": statistics.fmean(per_q), "top5_per_question": per_q,
                                "top5_tokens": top5_tokens, "top20_tokens": top20_tokens}
        cost: dict[str, float] = {"embedding": 0.0}
        for kind in args.kinds:
            verifier = None if kind == "embedding" else build_verifier(
                kind, base.verifier, device=cfg.device, batch_size=base.verifier_batch_size,
                max_passage_tokens=base.verifier_max_tokens, backend=args.backend, dtype=base.verifier_dtype)
            per_split: dict[str, dict[str, dict[str, list[float]]]] = {}
            n_scored, started = 0, time.perf_counter()
            for split, cal in calibrators.items():
                scores: dict[str, dict[str, list[float]]] = {}
                for q in tqdm(cal.questions, desc=f"{kind} {split}", unit="question"):
                    if verifier is None:
                        raw, base_raw = cal.similarities(q), None
                    else:
                        *raw, base_raw = verifier.margins(q, [*cal.texts(q), CONTENT_FREE])
                        n_scored += 1
                    for calibration, values in derive(kind, raw, base_raw).items():
                        scores.setdefault(calibration, {})[q] = values
                per_split[split] = scores
            if verifier is not None:
                cost[kind] = 1000.0 * (time.perf_counter() - started) / max(n_scored, 1)
                engine = getattr(verifier, "choice", {})
                print(f"{kind}: {cost[kind]:.0f} ms per question ({engine.get('backend')}/{engine.get('dtype')})")
            for calibration in CALIBRATIONS[kind]:
                for split, cal in calibrators.items():
                    cal.add_scores(f"{kind}/{calibration}", per_split[split][calibration])

        results = []
        variants = ["off"] + [f"{k}/{c}" for k in args.kinds for c in CALIBRATIONS[k]]
        target = baselines["calibrate"]["top5_recall"]
        for name in tqdm(variants, desc="sweep", unit="verifier"):
            cal = calibrators["calibrate"]
            points = cal.sweep(name, tau_grid(cal.scores[name]) if name != "off" else [0.0], args.t_max)
            row: dict[str, Any] = {"verifier": name, "ms_per_question": cost.get(name.split("/")[0], 0.0),
                                   "points": as_rows(points)}
            try:
                chosen = choose(points, baselines["calibrate"]["top5_per_question"], z=args.z)
            except CalibrationError as err:
                row["chosen"], row["error"] = None, str(err)
            else:
                held = calibrators["check"].point(name, chosen.tau, chosen.t_max)
                row["chosen"], row["check"] = as_rows([chosen])[0], as_rows([held])[0]
            results.append(row)

    b_cal, b_chk = baselines["calibrate"], baselines["check"]
    print(f"\ncalibration questions {args.calibrate}: top-5 recall {b_cal['top5_recall']:.3f} "
          f"({b_cal['top5_tokens']:.0f} tokens), top-20 {b_cal['top20_tokens']:.0f} tokens; check {args.check}: "
          f"top-5 recall {b_chk['top5_recall']:.3f} ({b_chk['top5_tokens']:.0f} tokens), top-20 "
          f"{b_chk['top20_tokens']:.0f} tokens")
    print("| verifier | tau | t_max | cal recall | cal tokens | cal vs top-20 | check recall | check tokens | "
          "check vs top-20 | check passes | verifier ms/q |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in results:
        c, h = row["chosen"], row.get("check")
        if c is None:
            print(f"| {row['verifier']} | no point: {row['error']} |")
            continue
        passes = h["recall"] >= b_chk["top5_recall"] and h["tokens"] <= 0.43 * b_chk["top20_tokens"]
        print(f"| {row['verifier']} | {c['tau']:.4g} | {c['t_max']} | {c['recall']:.3f} | {c['tokens']:.0f} | "
              f"{100 * (c['tokens'] / b_cal['top20_tokens'] - 1):+.1f}% | {h['recall']:.3f} | {h['tokens']:.0f} | "
              f"{100 * (h['tokens'] / b_chk['top20_tokens'] - 1):+.1f}% | {'yes' if passes else 'no'} | "
              f"{row['ms_per_question']:.0f} |")
    usable = [r for r in results if r["chosen"] and r["verifier"] != "off"]
    pick = None
    if usable:
        fewest = min(r["chosen"]["tokens"] for r in usable)
        near = [r for r in usable if r["chosen"]["tokens"] <= (1 + NEAR_BEST) * fewest]
        pick = min(near, key=lambda r: (r["ms_per_question"], r["chosen"]["tokens"]))
        c = pick["chosen"]
        kind, calibration = pick["verifier"].split("/")
        print(f"\nrule's pick: verifier_kind: {kind}  verifier_calibration: {calibration}  tau: {c['tau']:.4g}  "
              f"t_max: {c['t_max']}  (calibration recall {c['recall']:.3f} >= {target:.3f}, {c['tokens']:.0f} "
              f"tokens; check recall {pick['check']['recall']:.3f}, {pick['check']['tokens']:.0f} tokens)")
    out = Path(args.out) if args.out else out_dir / "calibration.json"
    write_json(out, {"calibrate": args.calibrate, "check": args.check, "baselines": baselines, "target": target,
                     "t_max": args.t_max, "z": args.z, "rule": f"fewest calibration tokens; within {NEAR_BEST:.0%}, cheapest",
                     "results": results, "pick": pick and pick["verifier"], "settings": base.meve_settings()})
    print(f"results -> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
