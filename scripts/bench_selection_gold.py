"""Does MoM selection find the right memory? The gold memory of a structured document against perturbed ones.

    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false .venv/bin/python \\
        scripts/bench_selection_gold.py --gold artifacts/datasets/structure/dev.jsonl --limit 20 \\
        --out artifacts/bench/selection_gold.json

For each document of ``--gold`` (JSONL records with ``text`` and ``sections`` / ``boundaries`` + ``titles``, read by
``memreader.data_gen.structure_teacher.sections_of``) the candidates are the gold memory (one scenario per section) and up
to three perturbations of its segmentation, each built by the same rule, so only the cuts differ: outline = the
title of the gold section where the scenario starts, core = the scenario's lead sentence(s) within
``--core-tokens`` evaluator tokens (``structure_teacher.lead_sentences``). Perturbations (every cut is a sentence
end of ``memreader.core.memory_grammar``, chosen with a per-document seeded rng):

- ``move``:  one gold boundary moved to the previous or the next sentence end;
- ``merge``: two adjacent segments merged (outline: the first one's title);
- ``split``: one segment cut at the sentence end nearest its middle (both halves keep the section title).

A perturbation that a document cannot take (no sentence end to move to, one segment, only one-sentence
segments) is skipped and counted. The candidates of a document are shuffled (ties in a ranking go to the
earlier candidate, so a fixed order would favour one of them), scored in one batched evaluator call
(``memreader.core.scoring.EvaluatorScorer``, as ``memreader gen`` builds it) and ranked and fused by
``memreader.data_gen.selection.select_candidates`` (RRF, k = ``--rrf-k``). Reported: how often the gold memory is
ranked first by clarity alone, by completeness alone and by RRF; the random pick (mean of 1/candidates); and,
per perturbation, how often gold scores higher than it (a tie counts one half). Intervals: 95% percentile
bootstrap over documents (``--resamples``, seeded).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from memreader import __version__
from memreader.core.corpus import Document
from memreader.core.fusion import RRF_K
from memreader.core.guidance import approx_tokens
from memreader.core.memory_grammar import sentence_ends
from memreader.core.registry import SMOLLM2
from memreader.core.schema import DocumentMemory, Scenario
from memreader.core.scoring_settings import EVALUATOR_BATCH_TOKENS
from memreader.data_gen.selection import METRICS, select_candidates
from memreader.data_gen.structure_teacher import free_text, lead_sentences, sections_of, snap
from memreader.eval.stats import bootstrap_ci

PERTURBATIONS = ("move", "merge", "split")


def perturb_move(starts: list[int], ends: list[int], n: int, rng: random.Random) -> list[int] | None:
    """``starts`` with one boundary (not the 0 start) moved to the previous or next sentence end, staying strictly
    between its neighbours; ``None`` when no boundary can move."""
    options = []
    for i in range(1, len(starts)):
        lo, hi = starts[i - 1], starts[i + 1] if i + 1 < len(starts) else n
        prev = [e for e in ends if lo < e < starts[i]]
        nxt = [e for e in ends if starts[i] < e < hi]
        options += [(i, x) for x in ([prev[-1]] if prev else []) + ([nxt[0]] if nxt else [])]
    if not options:
        return None
    i, x = rng.choice(options)
    return sorted([*starts[:i], x, *starts[i + 1:]])


def perturb_merge(starts: list[int], rng: random.Random) -> list[int] | None:
    """``starts`` without one boundary (two adjacent segments merged); ``None`` for a one-segment document."""
    if len(starts) < 2:
        return None
    i = rng.randrange(1, len(starts))
    return [*starts[:i], *starts[i + 1:]]


def perturb_split(starts: list[int], ends: list[int], n: int, rng: random.Random) -> list[int] | None:
    """``starts`` plus a cut at the sentence end nearest the middle of one segment that has one inside;
    ``None`` when every segment is one sentence."""
    options = []
    for s, e in zip(starts, [*starts[1:], n], strict=True):
        inside = [x for x in ends if s < x < e]
        if inside:
            options.append(min(inside, key=lambda x, mid=(s + e) / 2: (abs(x - mid), x)))
    if not options:
        return None
    return sorted([*starts, rng.choice(options)])


def build_memory(doc_id: str, text: str, starts: list[int], sections: list[tuple[int, str]],
                 count_tokens: Callable[[str], int], core_tokens: int) -> DocumentMemory:
    """One scenario per ``[start, next start)``: outline = title of the gold section it starts in, core = lead."""
    sec_starts = [min(snap(text, [st])) for st, _ in sections]  # where a chunk starting at the section starts
    scenarios = []
    for s, e in zip(starts, [*starts[1:], len(text)], strict=True):
        home = max([i for i, st in enumerate(sec_starts) if st <= s] or [0])
        chunk = text[s:e]
        outline = free_text(sections[home][1]) or free_text(chunk)[:60]
        scenarios.append(Scenario(outline, lead_sentences(chunk, core_tokens, count_tokens), s, e))
    mem = DocumentMemory(doc_id, text, scenarios)
    mem.validate()
    return mem


def candidates(record: dict[str, Any], seed: int, count_tokens: Callable[[str], int],
               core_tokens: int) -> tuple[list[tuple[str, DocumentMemory]], list[str]]:
    """The shuffled ``(kind, memory)`` candidates of one gold record (kind ``gold`` or a perturbation) and the
    perturbations it could not take."""
    doc = Document(str(record["id"]), record["text"], dict(record))
    sections = sections_of(doc)
    text, n = doc.text, len(doc.text)
    gold = sorted({0} | {s for s in snap(text, [s for s, _ in sections if s > 0]) if s < n})
    ends = sentence_ends(text)
    rng = random.Random(f"{seed}:{doc.doc_id}")  # per document: the same candidates whatever --limit
    starts = {"gold": gold, "move": perturb_move(gold, ends, n, rng), "merge": perturb_merge(gold, rng),
              "split": perturb_split(gold, ends, n, rng)}
    skipped = [k for k in PERTURBATIONS if starts[k] is None]
    out = [(k, build_memory(f"{doc.doc_id}#{k}", text, s, sections, count_tokens, core_tokens))
           for k, s in starts.items() if s is not None]
    assert all(starts[k] != gold for k, _ in out if k != "gold"), doc.doc_id
    rng.shuffle(out)
    return out, skipped


def judge(kinds: Sequence[str], scores: Sequence[dict[str, Any]], rrf_k: float) -> dict[str, Any]:
    """One document's outcome: did clarity / completeness / RRF rank gold first, and per perturbation and metric
    1 / 0.5 / 0 for gold scoring above / equal to / below it."""
    rows = select_candidates([{m: s.get(m) for m in METRICS} for s in scores], rrf_k)
    g = kinds.index("gold")
    out: dict[str, Any] = {"candidates": len(kinds), "random": 1 / len(kinds),
                           "pick": {m: rows[g][f"rank_{m}"] == 1 for m in METRICS} | {"rrf": rows[g]["selected"]},
                           "wins": {}}
    for i, kind in enumerate(kinds):
        if kind != "gold":
            out["wins"][kind] = {m: _win(scores[g].get(m), scores[i].get(m)) for m in METRICS}
    return out


def _win(gold: float | None, other: float | None) -> float | None:
    if gold is None or other is None:
        return None
    return 1.0 if gold > other else 0.5 if gold == other else 0.0


def bootstrap(values: Sequence[float], resamples: int, seed: int) -> dict[str, float]:
    """Mean and 95% percentile-bootstrap interval of ``values`` (resampled with replacement, seeded)."""
    x = np.asarray(values, dtype=float)
    if not len(x):
        return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0}
    ci = bootstrap_ci(x, n_resamples=resamples, seed=seed)  # the project's bootstrap (eval/stats.py)
    return {"mean": float(x.mean()), "lo": ci.low, "hi": ci.high, "n": int(len(x))}


def summarize(docs: Sequence[dict[str, Any]], resamples: int, seed: int) -> dict[str, Any]:
    """Pick rates, random baseline, RRF − random and pairwise win rates, each with its bootstrap interval."""
    pick = {m: bootstrap([float(d["pick"][m]) for d in docs], resamples, seed) for m in (*METRICS, "rrf")}
    pick["random"] = bootstrap([d["random"] for d in docs], resamples, seed)
    minus = {m: bootstrap([float(d["pick"][m]) - d["random"] for d in docs], resamples, seed) for m in (*METRICS, "rrf")}
    diff = minus["rrf"]
    pairwise = {k: {m: bootstrap([w for d in docs if k in d["wins"] for w in [d["wins"][k][m]] if w is not None],
                                 resamples, seed) for m in METRICS} for k in PERTURBATIONS}
    return {"pick": pick, "minus_random": minus, "rrf_minus_random": diff, "rrf_beats_random": bool(diff["lo"] > 0), "pairwise": pairwise}


def signature(args: argparse.Namespace, evaluator: str, docs: int) -> str:
    """Every setting that changes a number of this benchmark, sacrebleu style, version last."""
    return (f"gold:{Path(args.gold).name}|lang:{args.lang}|docs:{docs}|evaluator:{evaluator}|clarity:{args.clarity_variant}"
            f"|rrf_k:{args.rrf_k:g}|core:lead<={args.core_tokens}tok|perturb:{'+'.join(PERTURBATIONS)}|seed:{args.seed}"
            f"|boot:{args.resamples}|ci:95|version:{__version__}")


def load_gold(path: Path, lang: str, limit: int) -> list[dict[str, Any]]:
    """The first ``limit`` records (0: all) of ``lang`` (``all``: every language) from a gold JSONL file."""
    if not path.is_file():
        raise SystemExit(f"--gold {path} does not exist: build it with memreader structure-data")
    out = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                rec = json.loads(line)
                if lang == "all" or rec.get("lang") == lang:
                    out.append(rec)
                    if limit and len(out) >= limit:
                        break
    if not out:
        raise SystemExit(f"--gold {path} has no record with lang={lang!r}: use --lang all, en or zh")
    return out


def make_scorer(args: argparse.Namespace) -> Any:
    """The evaluator as ``memreader gen`` builds it for the transformers backend."""
    from memreader.core.scoring import EvaluatorScorer, ScorerSettings

    return EvaluatorScorer(ScorerSettings(evaluator=args.evaluator, evaluator_device=args.device,
                                          evaluator_dtype=args.dtype, clarity_variant=args.clarity_variant,
                                          evaluator_batch_tokens=args.batch_tokens))


def _fmt(b: dict[str, float]) -> str:
    return f"{b['mean']:.3f} [{b['lo']:.3f}, {b['hi']:.3f}] (n={b['n']})" if b["n"] else "- (n=0)"


def report(summary: dict[str, Any], sig: str) -> str:
    """The printed tables (every line under the signature that produced it)."""
    lines = [f"signature: {sig}", "gold ranked first, mean [95% bootstrap interval] over documents:"]
    labels = {"clarity": "clarity alone", "completeness": "completeness alone", "rrf": "RRF", "random": "random pick"}
    lines += [f"  {labels[k]:<20}{_fmt(summary['pick'][k])}" for k in labels]
    lines += [f"  {labels[k] + ' - random':<28}{_fmt(summary['minus_random'][k])}" for k in ("clarity", "completeness")]
    lines.append(f"  {'RRF - random':<20}{_fmt(summary['rrf_minus_random'])}")
    lines.append(f"RRF beats random outside the 95% interval: {'yes' if summary['rrf_beats_random'] else 'no'}")
    lines.append("gold scores higher than the perturbed candidate (tie = 1/2), mean [95% interval]:")
    for k, per in summary["pairwise"].items():
        lines.append(f"  {k:<7}" + "  ".join(f"{m} {_fmt(per[m])}" for m in METRICS))
    return "\n".join(lines)


def pool(args: argparse.Namespace) -> int:
    """Report the per-document rows of earlier runs together (same evaluator settings required)."""
    runs = [json.loads(Path(p).read_text(encoding="utf-8")) for p in args.from_json]
    keys = ("evaluator", "clarity_variant", "rrf_k", "core_tokens", "seed")
    settings = {tuple(r["settings"][k] for k in keys) for r in runs}
    if len(settings) > 1:
        raise SystemExit(f"--from-json: the runs differ in {', '.join(keys)}: {sorted(settings)}; pool like runs only")
    docs = [row for r in runs for row in r["rows"]]
    summary = summarize(docs, args.resamples, args.seed)
    sig = "+".join(r["signature"] for r in runs) + f"|pooled:{len(docs)}|boot:{args.resamples}"
    print(report(summary, sig))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"signature": sig, "pooled": list(args.from_json), "documents": len(docs),
                                              **summary}, ensure_ascii=False, indent=1), encoding="utf-8")
    return 0


def main(argv: list[str] | None = None, scorer: Any = None) -> int:
    """Run the benchmark; ``scorer`` (anything with ``score(memories)``) replaces the evaluator, for tests."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gold", default="artifacts/datasets/structure/dev.jsonl",
                    help="gold JSONL (id, text, lang, sections or boundaries + titles)")
    ap.add_argument("--limit", type=int, default=0, help="first N documents of --lang (0: all)")
    ap.add_argument("--lang", choices=("en", "zh", "all"), default="all", help="documents of this language only")
    ap.add_argument("--evaluator", default=SMOLLM2, help="evaluator causal LM (registry name or path)")
    ap.add_argument("--clarity-variant", default="ppl", choices=("ppl", "prob", "margin"), help="atomic-chunk clarity")
    ap.add_argument("--device", default="auto", help="evaluator device: auto, cpu, cuda")
    ap.add_argument("--dtype", default="auto", help="evaluator dtype: auto, float32, bfloat16")
    ap.add_argument("--batch-tokens", type=int, default=EVALUATOR_BATCH_TOKENS, help="evaluator tokens per forward batch")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--rrf-k", type=float, default=RRF_K, help=f"RRF smoothing constant (MoM: {RRF_K:g})")
    ap.add_argument("--core-tokens", type=int, default=76,
                    help="core = lead sentence(s) within this many evaluator tokens (structure teacher: 80 - 4)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the perturbations, the shuffles and the bootstrap")
    ap.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples over documents")
    ap.add_argument("--out", default="", help="write settings, summary and per-document rows here as JSON")
    ap.add_argument("--from-json", nargs="+", default=[], metavar="OUT_JSON",
                    help="no scoring: pool the per-document rows of earlier --out files (e.g. an English and a "
                         "Chinese run) and report them together")
    args = ap.parse_args(argv)
    if args.from_json:
        return pool(args)
    if args.core_tokens < 1 or args.resamples < 1 or args.limit < 0:
        ap.error("--core-tokens and --resamples must be >= 1 and --limit >= 0")
    records = load_gold(Path(args.gold), args.lang, args.limit)

    # -- evaluator
    t_load = time.perf_counter()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    scorer = scorer or make_scorer(args)
    tok = getattr(scorer, "tokenizer", None)
    count_tokens = (lambda s: len(tok.encode(s, add_special_tokens=False))) if tok is not None else approx_tokens
    evaluator = getattr(scorer, "evaluator", type(scorer).__name__)
    load_s = time.perf_counter() - t_load

    # -- candidates, scores, selection
    docs, skipped = [], dict.fromkeys(PERTURBATIONS, 0)
    t0 = time.perf_counter()
    for rec in tqdm(records, desc="documents", unit="doc"):
        cands, skip = candidates(rec, args.seed, count_tokens, args.core_tokens)
        for k in skip:
            skipped[k] += 1
        if len(cands) < 2:
            continue
        kinds = [k for k, _ in cands]
        scores = [{m: getattr(s, m) for m in METRICS} for s in scorer.score([m for _, m in cands])]
        row = judge(kinds, scores, args.rrf_k)
        row.update(id=rec["id"], lang=rec.get("lang"), kinds=kinds, scores=scores,
                   spans={k: [[s.start, s.end] for s in m.scenarios] for k, m in cands})
        docs.append(row)
    seconds = time.perf_counter() - t0
    if not docs:
        raise SystemExit(f"no document of {args.gold} had a perturbation to compare with (skipped: {skipped})")

    # -- report
    summary = summarize(docs, args.resamples, args.seed)
    sig = signature(args, evaluator, len(docs))
    n_cands = sum(d["candidates"] for d in docs)
    print(report(summary, sig))
    print(f"selection vs gold: {len(docs)} documents, {n_cands} candidates, skipped {skipped}, "
          f"{seconds:.1f} s scoring ({seconds / len(docs):.2f} s/doc) + {load_s:.1f} s load | {sig}")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"signature": sig, "settings": vars(args), "documents": len(docs),
                                   "candidates": n_cands, "skipped": skipped, **summary,
                                   "seconds": round(seconds, 2), "seconds_per_doc": round(seconds / len(docs), 3),
                                   "load_seconds": round(load_s, 2), "rows": docs}, ensure_ascii=False, indent=1),
                       encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
