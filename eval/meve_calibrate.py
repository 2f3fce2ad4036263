"""``memreader calibrate-meve``: choose MeVe's verifier and operating point leave-one-corpus-out, chosen on some
corpora and judged on one it never saw (the procedure and its result: docs/MEVE.md, "The shipped operating point").

    memreader calibrate-meve --data-dir ../shared/datasets
    memreader calibrate-meve --set corpora=[hotpotqa,cmrc2018] --set kinds=[embedding,lm_likelihood]

Every variant (``off``, each verifier kind x its calibrations; LM scores kept in the run folder's ``scores.json``
while their inputs are the same) is fitted on all corpora but one (:func:`fit`) and judged unchanged on the one left
out (:func:`fold`). The default is the variant that passes out of corpus everywhere with the fewest tokens (the
cheapest verifier within 5 %), fitted on all corpora together; when none passes everywhere, nothing is picked.
``cross_encoder`` (opt in: ``kinds``) scores each fold with the model that never saw the corpus it is judged on.
"""
from __future__ import annotations

import hashlib
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from memreader.core.config import field
from memreader.core.paths import run_dir, write_json
from memreader.core.stage import Flag, Stage
from memreader.eval.stats import paired_bootstrap
from memreader.eval.support_corpora import (
    CORPORA,
    corpus_store,
    load_support_corpus,
    support_recall,
    top_k_run,
)
from memreader.retrieval.meve import MeVePipeline, MeVeSettings, load_tokenizer
from memreader.retrieval.meve_calibration import (
    Calibrator,
    OperatingPoint,
    RememberingSource,
    margin,
    tau_grid,
)
from memreader.retrieval.verifier import build_verifier, sigmoid
from memreader.retrieval.verifier_calibration import CONTENT_FREE, EmbeddingVerifier, calibrated_margins

CALIBRATIONS = {"embedding": ("none", "query"), "lm": ("none", "content_free", "query"),
                "lm_likelihood": ("none", "content_free", "query"), "cross_encoder": ("none",)}
PER_FOLD = ("cross_encoder",)
"""Kinds trained on the corpora (``memreader train-verifier``): each fold scores with the model that never saw the
corpus it is judged on, so its scores belong to a (fold, corpus) pair, not to a corpus."""
NEAR_BEST = 0.05
GOAL_REDUCTION = 0.57
"""MeVe's goal: at least this share fewer context tokens than plain top-20 (and recall at least top-5's)."""

Budget = tuple[int, float, float]  # (t_max, budget_share, redundancy)


@dataclass
class CalibrateConfig(MeVeSettings):
    """The sweep of ``memreader calibrate-meve``; the MeVe keys (k, n_min, verifier, budget_tokenizer, ...) are the
    base every point changes only tau, the budget and the redundancy of."""

    corpora: list = field(list(CORPORA), help=f"support corpora, at least two: {', '.join(CORPORA)}")
    data_dir: str = field("../shared/datasets", help="folder of the public files the corpora are built from")
    embedder: str = field("", help="one embedder for every corpus (default: by language, as embedder: auto)")
    device: str = field("cpu", help="device of the embedders and the LM verifiers")
    kinds: list = field(["embedding", "lm", "lm_likelihood"], help=f"verifier kinds to try: {', '.join(CALIBRATIONS)}"
                        " (cross_encoder: the folders of cross_encoders)")
    cross_encoders: str = field("", help="folder of the cross-encoders `memreader train-verifier` wrote: "
                                "cross-encoder-without-<corpus> for each fold, cross-encoder (trained on all) for the "
                                "default (default: the run folder, where train-verifier --set run=<run> writes them)")
    t_maxes: list = field([768, 1024, 2048], help="absolute budgets to try")
    budget_shares: list = field([0.25, 0.3, 0.35, 0.4], help="budgets as a share of plain top-k's tokens, capped at "
                                "cap")
    cap: int = field(8192, ge=1, help="t_max with a budget share: SmolLM2's context")
    redundancies: list = field([0.85, 0.95], help="phase 4's cosine thresholds (the paper's 0.85 suits MiniLM; e5's "
                               "cosines crowd 0.86-0.95)")
    grid: int = field(6, ge=1, help="tau values per corpus and verifier: quantiles of its scores")
    z: float = field(1.0, ge=0, help="standard errors of the paired recall difference to spare when fitting "
                     "(retrieval/meve_calibration.py: margin)")
    run: str = field("calibrate-meve", help="run folder under $MEMREADER_HOME/runs: the stores (one per corpus) and "
                     "scores.json, kept (a rerun reuses what did not change)")
    out: str = field("", help="the JSON results (default: <run folder>/calibration.json)")

    def problems(self) -> list[str]:
        """Corpora that are unknown, fewer than two or whose files are missing; kinds that do not exist."""
        found = self.meve_problems()
        unknown = sorted(set(self.corpora) - set(CORPORA))
        if unknown:
            found.append(f"corpora: unknown {unknown}; choose from {', '.join(CORPORA)}")
        elif len(set(self.corpora)) < 2:
            found.append(f"corpora: leave-one-corpus-out needs at least two different corpora, got {self.corpora}")
        missing = [str(Path(self.data_dir) / f) for name in dict.fromkeys(self.corpora) if name in CORPORA
                   for f in CORPORA[name][0] if not (Path(self.data_dir) / f).is_file()]
        if missing:
            found.append(f"data_dir: {', '.join(missing)} not found; give the folder of the public files "
                         "(../shared/datasets/README.md says where they come from)")
        if "cross_encoder" in self.kinds:
            found += [f"cross_encoders: {f} not found; train it: memreader train-verifier --set run={self.run}"
                      f"{' --exclude ' + f.name.removeprefix('cross-encoder-without-') if '-without-' in f.name else ''}"
                      for f in map(self.cross_encoder, dict.fromkeys(self.corpora))
                      if not (f / "config.json").is_file()]
        if set(self.kinds) - set(CALIBRATIONS):
            found.append(f"kinds: unknown {sorted(set(self.kinds) - set(CALIBRATIONS))}; choose from "
                         f"{', '.join(CALIBRATIONS)}")
        return found

    def cross_encoder(self, held: str) -> Path:
        """The cross-encoder that never saw ``held`` (empty: the one trained on every corpus)."""
        root = Path(self.cross_encoders) if self.cross_encoders else run_dir(self.run)
        return root / (f"cross-encoder-without-{held}" if held else "cross-encoder")


def derive(kind: str, raw: list[float], base: float | None) -> dict[str, list[float]]:
    """The scores of every calibration of ``kind`` from its raw scores (and the content-free one)."""
    scores = {mode: [sigmoid(x) for x in calibrated_margins(mode, raw, base)] for mode in CALIBRATIONS[kind]}
    if kind == "embedding":  # the embedding verifier's own score is the clipped cosine, not its sigmoid
        scores["none"] = EmbeddingVerifier().score("-", ["-"] * len(raw), similarities=raw)
    return scores


class Corpus:
    """One support corpus: its store, its calibrator (phase-1 candidates, scores) and its top-k baselines."""

    def __init__(self, name: str, cfg: CalibrateConfig, tokenizer: Any, out_dir: Path) -> None:
        self.name, self.data = name, load_support_corpus(name, cfg.data_dir)
        self.embedder_name, self.embedder, self.store = corpus_store(self.data, out_dir / name / "passages.db",
                                                                     cfg.embedder, cfg.device)
        # what the kept verifier scores were computed over (scores.json is reused while it is the same)
        source = {"corpus": self.data.source, "embedder": self.embedder_name,
                  "passages": hashlib.sha256(json.dumps(self.data.passages).encode()).hexdigest()}
        self.fingerprint = hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()[:16]
        remembering = RememberingSource(self.store)  # a replay's fallback searches are the same every time
        settings = cfg.meve_settings()

        def pipeline_for(keys: dict[str, Any], verifier: Any) -> MeVePipeline:
            return MeVePipeline(remembering, self.embedder, verifier, tokenizer, MeVeSettings(**{**settings, **keys}))

        questions = [q.question for q in self.data.questions]
        self.cal = Calibrator(pipeline_for, questions, [set(q.gold) for q in self.data.questions])
        runs = {k: [top_k_run(self.store, self.embedder, tokenizer, q, k) for q in questions] for k in (5, 20)}
        recalls = {k: [support_recall(q.gold, r["doc_ids"]) for q, r in zip(self.data.questions, rs, strict=True)]
                   for k, rs in runs.items()}
        self.top5, self.top5_recall, self.top20_recall = recalls[5], statistics.fmean(recalls[5]), \
            statistics.fmean(recalls[20])
        self.top5_tokens, self.top20_tokens = (statistics.fmean(r["tokens"] for r in runs[k]) for k in (5, 20))
        self.cost: dict[str, float] = {"off": 0.0, "embedding": 0.0}  # verifier ms per question, per kind
        self._points: dict[tuple[str, float, Budget], OperatingPoint] = {}

    def point(self, variant: str, tau: float, budget: Budget) -> OperatingPoint:
        """Phases 2-5 at one setting over this corpus's questions (memoised)."""
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


def _model_raw(kind: str, name: str, c: Corpus, cfg: CalibrateConfig, cache: dict, cache_path: Path,
               verifiers: dict, label: str = "") -> dict:
    """Verifier ``name``'s raw scores on corpus ``c`` (every question's candidates + the content-free passage), from
    ``cache`` while their inputs are the same, else computed, timed and kept under ``label`` (default: ``kind``)."""
    cal, label = c.cal, label or kind
    trained = Path(name) / "training.json"  # a trained folder: retraining it in place changes the fingerprint
    fingerprint = hashlib.sha256(json.dumps(
        [kind, name, trained.read_text() if trained.is_file() else "", cfg.verifier_max_tokens, cfg.verifier_backend,
         cfg.verifier_dtype, c.fingerprint, {q: cal.texts(q) for q in cal.questions}]).encode()).hexdigest()[:16]
    kept = cache.get(c.name, {}).get(label)
    if kept and kept["fingerprint"] == fingerprint:
        print(f"{c.name} {label}: raw scores reused from {cache_path} ({kept['ms_per_question']:.0f} ms per question "
              "when measured)")
        return kept
    if name not in verifiers:
        verifiers.clear()  # one model in memory at a time
        verifiers[name] = build_verifier(kind, name, device=cfg.device, batch_size=cfg.verifier_batch_size,
                                         max_passage_tokens=cfg.verifier_max_tokens, backend=cfg.verifier_backend,
                                         dtype=cfg.verifier_dtype)
    raw_all, started = {}, time.perf_counter()
    for q in tqdm(cal.questions, desc=f"{c.name} {label}", unit="question"):
        raw_all[q] = verifiers[name].margins(q, [*cal.texts(q), CONTENT_FREE])
    ms = 1000.0 * (time.perf_counter() - started) / len(cal.questions)
    kept = {"fingerprint": fingerprint, "raw": raw_all, "ms_per_question": ms,
            "engine": getattr(verifiers[name], "choice", {})}
    cache.setdefault(c.name, {})[label] = kept
    write_json(cache_path, cache)
    print(f"{c.name} {label}: {ms:.0f} ms per question ({kept['engine'].get('backend')}/{kept['engine'].get('dtype')})")
    return kept


def _add(c: Corpus, kind: str, name: str, raws: dict[str, tuple[list[float], float | None]]) -> None:
    """Every calibration of ``kind`` over ``raws`` (question -> raw scores, content-free score) as ``name/<mode>``."""
    per_calibration: dict[str, dict[str, list[float]]] = {}
    for q, (raw, content_free) in raws.items():
        for calibration, values in derive(kind, raw, content_free).items():
            per_calibration.setdefault(calibration, {})[q] = values
    for calibration, scores in per_calibration.items():
        c.cal.add_scores(f"{name}/{calibration}", scores)


def scored(variant: str, held: str) -> str:
    """The scores ``variant`` reads in the fold that leaves ``held`` out (empty: the default's fit on every corpus):
    its own, or for a kind trained on the corpora the fold's model's (``cross_encoder@<held>/none``)."""
    kind, _, calibration = variant.partition("/")
    return f"{kind}@{held}/{calibration}" if kind in PER_FOLD else variant


def score_corpora(corpora: dict[str, Corpus], cfg: CalibrateConfig, cache_path: Path) -> None:
    """Every variant's scores on every corpus (LM scores computed once and kept in ``cache_path``)."""
    cache = json.loads(cache_path.read_text()) if cache_path.is_file() else {}
    verifiers: dict[str, Any] = {}
    for kind in cfg.kinds:
        if kind in PER_FOLD:  # each fold's model on every corpus (fitted on the others, judged on its own held-out)
            if not (cfg.cross_encoder("") / "config.json").is_file():
                print(f"cross_encoder: no model trained on every corpus ({cfg.cross_encoder('')}): the folds run, but "
                      "this kind cannot be the default (train it: memreader train-verifier --set run=<run>)")
            for held in [*corpora, ""] if (cfg.cross_encoder("") / "config.json").is_file() else corpora:
                name = str(cfg.cross_encoder(held))
                for c in corpora.values():
                    kept = _model_raw(kind, name, c, cfg, cache, cache_path, verifiers, f"{kind}@{held}")
                    if held == c.name:  # the cost a user meets: a model on a corpus it never saw
                        c.cost[kind] = kept["ms_per_question"]
                    _add(c, kind, f"{kind}@{held}", {q: (v[:-1], v[-1]) for q, v in kept["raw"].items()})
            continue
        for c in corpora.values():
            if kind == "embedding":
                raws = {q: (c.cal.similarities(q), None) for q in c.cal.questions}
            else:
                kept = _model_raw(kind, cfg.verifier, c, cfg, cache, cache_path, verifiers)
                c.cost[kind] = kept["ms_per_question"]
                raws = {q: (v[:-1], v[-1]) for q, v in kept["raw"].items()}
            _add(c, kind, kind, raws)


def budget_text(budget: Budget) -> str:
    t_max, share, redundancy = budget
    return (f"share {share:g} (cap {t_max})" if share else f"t_max {t_max}") + f", redundancy {redundancy:g}"


def fit(variant: str, fitting: list[Corpus], budgets: list[Budget], grid: int, z: float
        ) -> tuple[tuple[float, Budget] | None, str]:
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


def fold(corpora: dict[str, Corpus], held: str, variants: list[str], cost: dict[str, float], budgets: list[Budget],
         cfg: CalibrateConfig) -> dict[str, Any]:
    """Every variant fitted on the corpora but ``held`` and judged on ``held``; the fold's pick."""
    fitting = [c for n, c in corpora.items() if n != held]
    rows = []
    for v in variants:
        key = scored(v, held)
        chosen, line = fit(key, fitting, budgets, cfg.grid, cfg.z)
        row: dict[str, Any] = {"variant": v, "fit": line}
        if chosen is not None:
            tau, budget = chosen
            points = [c.point(key, tau, budget) for c in fitting]
            p = corpora[held].point(key, tau, budget)
            row.update(tau=tau, t_max=budget[0], budget_share=budget[1], redundancy=budget[2],
                       train_ratio=statistics.fmean(c.ratio(q) for c, q in zip(fitting, points, strict=True)),
                       recall=p.recall, tokens=p.tokens, ratio=corpora[held].ratio(p), fallback=p.fallback_share,
                       passes=corpora[held].passes(p), ms=corpora[held].cost[v.split("/")[0]])
        rows.append(row)
    chosen_row = pick([r for r in rows if "tau" in r], "train_ratio", cost)
    return {"rows": rows, "pick": chosen_row and chosen_row["variant"]}


def print_tables(corpora: dict[str, Corpus], folds: dict[str, dict[str, Any]], z: float) -> None:
    """The corpora's baselines, every fold's rows and each variant's value over the budget alone."""
    print("\n| corpus | passages | questions | embedder | top-5 recall | top-5 tokens | top-20 recall | top-20 tokens | "
          "token goal (<=) |\n|---|---|---|---|---|---|---|---|---|")
    for c in corpora.values():
        print(f"| {c.name} | {len(c.data.passages)} | {len(c.cal.questions)} | {c.embedder_name} | "
              f"{c.top5_recall:.3f} | {c.top5_tokens:.0f} | {c.top20_recall:.3f} | {c.top20_tokens:.0f} | "
              f"{(1 - GOAL_REDUCTION) * c.top20_tokens:.0f} |")
    print(f"\nOut of corpus: each variant fitted on the other corpora (goal on each with {z:g} SE to spare), judged "
          "unchanged on the one left out (recall >= its top-5's, tokens >= 57% below its top-20's)\n"
          "| left out | variant | tau, budget (fitted on the others) | recall (top-5) | tokens (vs top-20) | fallback | "
          "passes | verifier ms/q |\n|---|---|---|---|---|---|---|---|")
    for held, f in folds.items():
        c = corpora[held]
        for r in f["rows"]:
            if "tau" not in r:
                print(f"| {held} | {r['variant']} | no point: {r['fit'].split('; ', 1)[1]} | — | — | — | no | — |")
                continue
            mark = " **(fold's pick)**" if r["variant"] == f["pick"] else ""
            print(f"| {held} | {r['variant']}{mark} | {r['tau']:.4g}, "
                  f"{budget_text((r['t_max'], r['budget_share'], r['redundancy']))} | {r['recall']:.3f} "
                  f"({c.top5_recall:.3f}) | {r['tokens']:.0f} ({100 * (r['ratio'] - 1):+.1f}%) | "
                  f"{100 * r['fallback']:.0f}% | {'yes' if r['passes'] else 'no'} | {r['ms']:.0f} |")
    print("\nThe verifier's marginal value out of corpus: each variant at the point fitted on the other corpora, against "
          "no verification at the same budget and redundancy (the budget alone); recall gained with its 95 % paired "
          "bootstrap interval over the questions\n| left out | variant | recall (budget alone) | tokens (budget alone) "
          "| recall gained [95 % CI] | tokens saved | verifier s/question |\n|---|---|---|---|---|---|---|")
    for held, f in folds.items():
        for r in f["rows"]:
            if r["variant"] == "off" or "tau" not in r:
                continue
            budget = (r["t_max"], r["budget_share"], r["redundancy"])
            alone = corpora[held].point("off", 0.0, budget)
            gain = paired_bootstrap(corpora[held].point(scored(r["variant"], held), r["tau"], budget).per_question,
                                    alone.per_question)
            r["budget_alone"] = {"recall": alone.recall, "tokens": alone.tokens, "recall_gained": gain.delta,
                                 "recall_gained_ci": [gain.interval.low, gain.interval.high]}
            print(f"| {held} | {r['variant']} | {r['recall']:.3f} ({alone.recall:.3f}) | {r['tokens']:.0f} "
                  f"({alone.tokens:.0f}) | {gain.delta:+.3f} [{gain.interval.low:+.3f}, {gain.interval.high:+.3f}] | "
                  f"{alone.tokens - r['tokens']:+.0f} | {r['ms'] / 1000:.2f} |")


def run_folds(corpora: dict[str, Corpus], variants: list[str], cost: dict[str, float], cfg: CalibrateConfig
              ) -> dict[str, Any]:
    """Every fold, the tables, the default and (when one point holds on all corpora) its MeVe keys."""
    budgets = [(t, 0.0, r) for r in cfg.redundancies for t in cfg.t_maxes] + [
        (cfg.cap, share, r) for r in cfg.redundancies for share in cfg.budget_shares]
    folds = {held: fold(corpora, held, variants, cost, budgets, cfg) for held in tqdm(corpora, desc="folds",
                                                                                        unit="corpus")}
    print_tables(corpora, folds, cfg.z)
    everywhere = []
    for v in variants:
        rows = [next(r for r in f["rows"] if r["variant"] == v) for f in folds.values()]
        if all(r.get("passes") for r in rows):
            everywhere.append({"variant": v, "oof_ratio": statistics.fmean(r["ratio"] for r in rows)})
    picks = []
    for held, f in folds.items():
        row = next((r for r in f["rows"] if r["variant"] == f["pick"]), None)
        picks.append(f"{held} left out -> {f['pick'] or 'none'} ({'—' if row is None else 'passes' if row['passes'] else 'fails'})")
    print("\nfold picks: " + "; ".join(picks))
    default = pick(everywhere, "oof_ratio", cost)
    result: dict[str, Any] = {"folds": folds, "cost_ms": cost, "passes_everywhere": [r["variant"] for r in everywhere],
                              "default": None}
    if default is None:
        print("default: NONE — no variant passes out of corpus on every corpus; nothing is chosen (see the tables)")
        return result
    v = result["default"] = default["variant"]
    if scored(v, "") != v and not any(scored(v, "") in c.cal.scores for c in corpora.values()):
        print(f"default: {v} passes out of corpus everywhere, but no model trained on every corpus was scored: train "
              "it (memreader train-verifier) and rerun to fit its keys; nothing is written")
        return result
    chosen, line = fit(scored(v, ""), list(corpora.values()), budgets, cfg.grid, cfg.z)
    print(f"default: {v} (passes out of corpus on every corpus: {', '.join(corpora)}; mean out-of-corpus tokens "
          f"{100 * (default['oof_ratio'] - 1):+.1f}% vs top-20); on all corpora: {line}")
    if chosen is None:
        print("  no single point meets the goal on all corpora together; nothing is written")
        return result
    tau, (t_max, share, redundancy) = chosen
    keys: dict[str, Any] = {"verify": False} if v == "off" else {
        "verify": True, "verifier_kind": v.split("/")[0], "verifier_calibration": v.split("/")[1], "tau": tau}
    if v.split("/")[0] in PER_FOLD:
        keys["verifier"] = str(cfg.cross_encoder(""))
    keys.update(t_max=t_max, budget_share=share, redundancy=redundancy)
    oof = "; ".join(f"{h}: recall {r['recall']:.3f} vs top-5 {corpora[h].top5_recall:.3f}, tokens "
                    f"{100 * (r['ratio'] - 1):+.1f}% vs top-20"
                    for h, f in folds.items() for r in f["rows"] if r["variant"] == v)
    keys["operating_point"] = (f"{v} chosen leave-one-corpus-out by memreader calibrate-meve on "
                               f"{', '.join(corpora)} (docs/MEVE.md); out of corpus: {oof}")
    result["keys"] = keys
    print("\nMeVe keys (retrieval/meve_settings.py; configs/retrieval/meve_hotpotqa.yaml, three_layer_minilm.yaml):")
    for key, value in keys.items():
        print(f"  {key}: {json.dumps(value) if isinstance(value, str) else value}")
    return result


def calibrate(cfg: CalibrateConfig) -> int:
    """Build every corpus, score every variant, run the folds and write the results JSON."""
    tokenizer = load_tokenizer(cfg.budget_tokenizer)
    out_dir = run_dir(cfg.run)
    corpora = {name: Corpus(name, cfg, tokenizer, out_dir) for name in dict.fromkeys(cfg.corpora)}
    try:
        score_corpora(corpora, cfg, out_dir / "scores.json")
        variants = ["off"] + [f"{k}/{c}" for k in cfg.kinds for c in CALIBRATIONS[k]]
        cost = {v: statistics.fmean(c.cost[v.split("/")[0]] for c in corpora.values()) for v in variants}
        report = run_folds(corpora, variants, cost, cfg)
    finally:
        for c in corpora.values():
            c.store.close()
    out = Path(cfg.out) if cfg.out else out_dir / "calibration.json"
    write_json(out, {**report, "corpora": {n: {"source": c.data.source, "note": c.data.note,
                                               "embedder": c.embedder_name, "questions": len(c.cal.questions),
                                               "passages": len(c.data.passages), "top5_recall": c.top5_recall,
                                               "top20_recall": c.top20_recall, "top5_tokens": c.top5_tokens,
                                               "top20_tokens": c.top20_tokens, "verifier_ms": c.cost}
                                           for n, c in corpora.items()},
                     "t_max": cfg.t_maxes, "budget_share": cfg.budget_shares, "cap": cfg.cap,
                     "redundancy": cfg.redundancies, "z": cfg.z, "grid": cfg.grid, "settings": cfg.meve_settings()})
    print(f"results -> {out}", file=sys.stderr)
    return 0


STAGE = Stage("calibrate-meve", "choose MeVe's verifier and operating point leave-one-corpus-out on support corpora",
              run=calibrate, config=CalibrateConfig, example_dir="configs/retrieval/ (the MeVe keys)",
              flags=(Flag("data_dir"), Flag("out")))

if __name__ == "__main__":
    from memreader.cli import module_main

    raise SystemExit(module_main("calibrate-meve"))
