"""Score predictions against references: means, 95% bootstrap intervals and signatures per metric.

    from memreader.eval.score import score_pairs, format_table
    report = score_pairs(predictions, references, profile="mom")   # references: str or list[str] each
    print(format_table({"memreader": report}))

The ``memreader score`` command is :mod:`memreader.eval.score_cli`. Details (file layouts, the JSON report):
docs/EVALUATION.md (Quick start).
"""

from __future__ import annotations

import importlib.metadata
import math
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memreader.core.hardware import cpu_cores
from memreader.eval.datasets import DatasetError
from memreader.eval.metrics import (
    DISPLAY_NAMES,
    EVAL_VERSION,
    METRICS,
    ExampleScores,
    MetricConfig,
    corpus_bleu,
    prepare,
    reopen_wordnet_files,
    resolve_config,
    score_example,
    signatures,
)
from memreader.eval.stats import (
    DEFAULT_CONFIDENCE,
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    Interval,
    PairedTest,
    bootstrap_cis,
    bootstrap_distribution,
    corpus_bleu_from_counts,
    paired_bootstrap_statistic,
    paired_test,
    percentile_interval,
    permutation_p,
)

_LIBRARIES = ("jieba", "nltk", "rouge-score", "sacrebleu", "numpy")


@dataclass
class MetricResult:
    """One metric over a set: headline value, its interval, signature and per-example scores."""

    name: str
    value: float
    interval: Interval
    signature: str
    per_example: list[float]
    aggregation: str = "mean"

    def to_dict(self, per_example: bool = True) -> dict[str, Any]:
        """Plain-JSON form."""
        out = {"metric": DISPLAY_NAMES[self.name], "value": self.value, "aggregation": self.aggregation,
               "ci_low": self.interval.low, "ci_high": self.interval.high, "interval": self.interval.to_dict(),
               "signature": self.signature}
        if per_example:
            out["per_example"] = self.per_example
        return out


@dataclass
class ScoreReport:
    """Everything :func:`score_pairs` measured, enough to reproduce and compare it."""

    profile: str
    config: MetricConfig
    ids: list[str]
    metrics: dict[str, MetricResult]
    excluded: list[str]
    examples: list[ExampleScores] = field(repr=False)
    seconds: float = 0.0

    @property
    def n(self) -> int:
        """Examples that count towards the means (all but ``excluded``)."""
        return len(self.ids) - len(self.excluded)

    def signatures(self) -> dict[str, str]:
        """Signature per metric name."""
        return {name: m.signature for name, m in self.metrics.items()}

    def to_dict(self, per_example: bool = True) -> dict[str, Any]:
        """JSON-ready report: settings, versions, values, intervals, signatures (and per-example scores)."""
        return {"profile": self.profile, "config": asdict(self.config), "n": self.n, "n_total": len(self.ids),
                "excluded_ids": self.excluded, "metrics": {name: m.to_dict(per_example) for name, m in self.metrics.items()},
                "ids": self.ids if per_example else None,
                "versions": {"mr-eval": EVAL_VERSION, **{lib: importlib.metadata.version(lib) for lib in _LIBRARIES}},
                "seconds": round(self.seconds, 3)}


def _score_chunk(job: tuple[MetricConfig, list[str], list[list[str]]]) -> list[ExampleScores]:
    config, predictions, references = job
    return [score_example(p, r, config) for p, r in zip(predictions, references, strict=True)]


def _init_worker(config: MetricConfig) -> None:
    reopen_wordnet_files()  # forked: the parent's open WordNet files would be shared (see its docstring)
    prepare(config)


def score_examples(predictions: Sequence[str], references: Sequence[str | Sequence[str]], config: MetricConfig,
                   workers: int | None = None, progress: bool = False) -> list[ExampleScores]:
    """Score many examples, in ``workers`` processes (default: all CPUs; 1 = in this process).

    Each example is scored independently by :func:`score_example`, so the result equals the
    one-at-a-time path exactly, whatever the number of workers.
    """
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} reference entries")
    prepare(config)
    preds = list(predictions)
    refs = [[r] if isinstance(r, str) else list(r) for r in references]
    workers = cpu_cores() if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    from tqdm import tqdm

    if workers == 1 or len(preds) < 64:
        return [score_example(p, r, config) for p, r in tqdm(zip(preds, refs, strict=True), total=len(preds),
                                                              desc="scoring", unit="ex", disable=not progress)]
    # Several chunks per worker even out uneven lengths; order is kept by ``map``.
    size = max(16, math.ceil(len(preds) / (workers * 8)))
    jobs = [(config, preds[i : i + size], refs[i : i + size]) for i in range(0, len(preds), size)]
    with ProcessPoolExecutor(max_workers=workers, initializer=_init_worker, initargs=(config,)) as pool:
        return [e for chunk in tqdm(pool.map(_score_chunk, jobs), total=len(jobs), desc=f"scoring ({workers} procs)",
                                    unit="chunk", disable=not progress) for e in chunk]


def _included(examples: Sequence[ExampleScores], config: MetricConfig) -> np.ndarray:
    return np.array([not (e.blank and config.empty == "skip") for e in examples], dtype=bool)


def _counts(examples: Sequence[ExampleScores]) -> np.ndarray:
    return np.array([[*e.bleu_stats.matches, *e.bleu_stats.possible, e.bleu_stats.hyp_len, e.bleu_stats.ref_len]
                     for e in examples], dtype=float)


def score_pairs(predictions: Sequence[str], references: Sequence[str | Sequence[str]], profile: str = "mom", *,
                ids: Sequence[str] | None = None, workers: int | None = None, n_resamples: int = DEFAULT_RESAMPLES,
                confidence: float = DEFAULT_CONFIDENCE, seed: int = DEFAULT_SEED, progress: bool = False,
                **overrides: Any) -> ScoreReport:
    """Score ``predictions[i]`` against ``references[i]`` (a string or a list of strings).

    ``profile`` picks the settings (``mom`` or ``crud``); keyword ``overrides`` change single
    settings (e.g. ``meteor_wordnet=False``) and show up in the signatures.
    """
    config = resolve_config(profile, **overrides)
    ids = [str(i) for i in ids] if ids is not None else [str(i) for i in range(len(predictions))]
    if len(ids) != len(predictions):
        raise ValueError(f"{len(ids)} ids for {len(predictions)} predictions")
    if not predictions:
        raise DatasetError("<inputs>", "there is no (prediction, reference) pair to score: both inputs are empty; "
                           "give files with at least one line each")
    start = time.perf_counter()
    examples = score_examples(predictions, references, config, workers=workers, progress=progress)
    keep = _included(examples, config)
    if not keep.any():
        raise ValueError("no example left to score (all predictions or references are blank and empty='skip')")
    kept = [e for e, k in zip(examples, keep, strict=True) if k]
    sigs = signatures(config)
    table = np.array([[getattr(e, name) for name in METRICS] for e in examples], dtype=float)
    intervals = dict(zip(METRICS, bootstrap_cis(table[keep], n_resamples, confidence, seed), strict=True))
    metrics: dict[str, MetricResult] = {}
    for column, name in enumerate(METRICS):
        values = table[:, column].tolist()
        if name in ("bleu_1", "bleu_avg") and config.bleu_level == "corpus":
            which = 0 if name == "bleu_1" else 1
            counts = _counts(kept)
            value = corpus_bleu(kept, config)[which]
            draws = bootstrap_distribution(
                len(kept), lambda w, c=which, m=counts: _corpus(w @ m, config)[c], n_resamples, seed)
            interval = percentile_interval(draws, confidence, n_resamples, seed)
            metrics[name] = MetricResult(name, value, interval, sigs[name], values, "corpus")
        else:
            metrics[name] = MetricResult(name, float(table[keep, column].mean()), intervals[name], sigs[name], values)
    excluded = [i for i, k in zip(ids, keep, strict=True) if not k]
    return ScoreReport(profile, config, ids, metrics, excluded, examples, time.perf_counter() - start)


def _corpus(counts: np.ndarray, config: MetricConfig) -> tuple[np.ndarray, np.ndarray]:
    return corpus_bleu_from_counts(counts, config.bleu_max_order, config.bleu_smoothing, config.bleu_brevity_penalty)


def compare(a: ScoreReport, b: ScoreReport, n_resamples: int = DEFAULT_RESAMPLES,
            confidence: float = DEFAULT_CONFIDENCE, seed: int = DEFAULT_SEED) -> dict[str, PairedTest]:
    """Paired tests of system ``a`` minus system ``b``, scored on the same ids with the same settings
    (:func:`memreader.eval.stats.paired_test`; corpus-level BLEU on resampled pooled counts).

    Items excluded from either report are left out of both."""
    if a.ids != b.ids:
        raise ValueError("paired comparison needs both reports on the same ids in the same order")
    if a.signatures() != b.signatures():
        raise ValueError("paired comparison needs identical metric settings (signatures differ)")
    keep = _included(a.examples, a.config) & _included(b.examples, b.config)
    if not keep.any():
        raise ValueError("no example is scored in both reports")
    drop = [*a.excluded, *b.excluded]
    return {name: _corpus_paired(a, b, name, keep, n_resamples, confidence, seed)
            if a.metrics[name].aggregation == "corpus" else
            paired_test(a.ids, a.metrics[name].per_example, b.ids, b.metrics[name].per_example, drop, n_resamples,
                        confidence, seed)
            for name in METRICS}


def _corpus_paired(a: ScoreReport, b: ScoreReport, name: str, keep: np.ndarray, n_resamples: int,
                   confidence: float, seed: int) -> PairedTest:
    """The paired test of a corpus-level BLEU column: its difference on the kept items, interval and bootstrap
    p-value from resampled pooled counts, permutation p-value from the per-item scores."""
    column = 0 if name == "bleu_1" else 1
    ea = [e for e, k in zip(a.examples, keep, strict=True) if k]
    eb = [e for e, k in zip(b.examples, keep, strict=True) if k]
    ca, cb = _counts(ea), _counts(eb)
    diffs = np.asarray(a.metrics[name].per_example)[keep] - np.asarray(b.metrics[name].per_example)[keep]
    delta = corpus_bleu(ea, a.config)[column] - corpus_bleu(eb, a.config)[column]
    interval, p_boot = paired_bootstrap_statistic(
        len(diffs), lambda w: _corpus(w @ ca, a.config)[column], lambda w: _corpus(w @ cb, a.config)[column],
        delta, n_resamples, confidence, seed)
    return PairedTest(delta, interval, p_boot, permutation_p(diffs, n_resamples, seed), len(diffs))


def format_table(reports: ScoreReport | Mapping[str, ScoreReport], digits: int = 4) -> str:
    """A plain-text table: one row per system, ``value [ci_low, ci_high]`` per metric, then signatures."""
    if isinstance(reports, ScoreReport):
        reports = {reports.profile: reports}
    if not reports:
        raise ValueError("format_table needs at least one report")
    header = ["system", "n", *(DISPLAY_NAMES[m] for m in METRICS)]
    rows = [header]
    for system, rep in reports.items():
        cells = [f"{r.value:.{digits}f} [{r.interval.low:.{digits}f}, {r.interval.high:.{digits}f}]"
                 for r in (rep.metrics[m] for m in METRICS)]
        rows.append([system, str(rep.n), *cells])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    first = next(iter(reports.values()))
    interval = first.metrics[METRICS[0]].interval
    lines.append(f"intervals: {interval.confidence:.0%} {interval.method}, "
                 f"{interval.n_resamples} resamples, seed {interval.seed}")
    distinct = {tuple(r.signatures().items()) for r in reports.values()}
    shown = {"": first} if len(distinct) == 1 else {f" ({system})": rep for system, rep in reports.items()}
    for label, rep in shown.items():
        lines.append(f"signatures{label}:")
        lines += [f"  {DISPLAY_NAMES[m]:<9}{rep.metrics[m].signature}" for m in METRICS]
    excluded = {s: len(r.excluded) for s, r in reports.items() if r.excluded}
    if excluded:
        lines.append("excluded (blank, empty=skip): " + ", ".join(f"{s}: {k}" for s, k in excluded.items()))
    return "\n".join(lines)


def join_by_id(predictions: Mapping[str, str], references: Mapping[str, list[str]],
               pred_path: str | Path, ref_path: str | Path) -> tuple[list[str], list[str], list[list[str]]]:
    """``(ids, predictions, references)`` in reference-file order; any id on one side only is an error."""
    missing = [i for i in references if i not in predictions]
    extra = [i for i in predictions if i not in references]
    problems = []
    if missing:
        problems.append(f"{len(missing)} reference id(s) have no prediction in {pred_path}: {', '.join(missing[:5])}")
    if extra:
        problems.append(f"{len(extra)} prediction id(s) are not in {ref_path}: {', '.join(extra[:5])}")
    if problems:
        raise DatasetError(pred_path, "; ".join(problems) + " (ids are compared as strings)")
    ids = list(references)
    return ids, [predictions[i] for i in ids], [references[i] for i in ids]


if __name__ == "__main__":  # python -m memreader.eval.score ... is memreader score ...
    from memreader.cli import module_main

    raise SystemExit(module_main("score"))
