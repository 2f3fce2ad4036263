"""``memreader report RUN``: a Markdown report with PNG plots of one evaluation run.

    memreader report my-run                      # $MEMREADER_HOME/runs/my-run/eval/ -> .../eval/report/
    python -m memreader.eval.report artifacts/runs/my-run/eval --out /tmp/report

Reads ``<eval>/summary.json`` and ``<eval>/methods/<method>/{memories,answers}.jsonl`` (layout in
docs/EVALUATION.md, "Report") and writes ``report.md`` with its PNG figures, ``report.json`` (the derived
statistics: support intervals, paired tests, the correlation table) and ``report.html`` (the same as one offline
page, plus what each method retrieved and answered per question: :mod:`memreader.eval.report_page`). Paired tests
are every method minus ``memreader`` on the same items (:func:`memreader.eval.stats.paired_test`, as ``memreader
score --baseline``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memreader.core.config import field as config_field
from memreader.core.errors import MemReaderError
from memreader.core.paths import memreader_home, write_atomic, write_json
from memreader.core.schema import DocumentMemory, read_memories
from memreader.core.stage import Flag, Stage
from memreader.core.structure import describe_where
from memreader.eval import paper_tables as paper
from memreader.eval.intrinsic.correlation import CorrelationRow, correlation_table
from memreader.eval.intrinsic.section import clarity_row, clarity_section, intrinsic_section
from memreader.eval.markdown import fmt, interval, table, value_ci
from memreader.eval.records import EvalSummary, MethodRecord, MetricRecord, SummaryError, SupportRecord
from memreader.eval.report_page import write_report_page
from memreader.eval.stats import DEFAULT_RESAMPLES, DEFAULT_SEED, NotComparable, bootstrap_ci, paired_test

REFERENCE = "memreader"
METRIC_ORDER = ("bleu_1", "bleu_2", "bleu_3", "bleu_4", "bleu_avg", "rouge_l", "meteor")
_FIX = "re-run the evaluation stage for this run (it writes summary.json and methods/), or repair the named entry"


class ReportError(MemReaderError, ValueError):
    """A run folder the report cannot be built from; the message names the file and the fix."""


@dataclass
class Method:
    """One evaluated method: its summary record, memories and answers."""

    name: str
    record: MethodRecord
    memories: list[DocumentMemory]
    answers: list[dict[str, Any]]

    @property
    def chunk_lengths(self) -> list[int]:
        """Length in characters of every chunk of every memory."""
        return [s.end - s.start for m in self.memories for s in m.scenarios]


def eval_dir(run: str) -> Path:
    """The eval folder of ``run``: a path (the eval folder or its run folder) or a run name."""
    path, named = Path(run).expanduser(), memreader_home() / "runs" / run / "eval"
    for candidate in (path, path / "eval", named):
        if (candidate / "summary.json").is_file():
            return candidate
    raise ReportError(f"no summary.json in {path}, {path / 'eval'} or {named}",
                      "give a run name under $MEMREADER_HOME/runs/ or the path of an eval folder; run the "
                      "evaluation stage first")


def _read_answers(path: Path) -> list[dict[str, Any]]:
    answers = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                answers.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ReportError(f"{path}:{n}: not valid JSON ({exc})", _FIX) from exc
    return answers


def load_run(folder: Path) -> tuple[EvalSummary, dict[str, Method]]:
    """The checked summary (:meth:`memreader.eval.records.EvalSummary.read`) and every method's files, or
    :class:`ReportError` naming the file and the fix."""
    path = folder / "summary.json"
    try:
        summary = EvalSummary.read(path)
    except SummaryError as exc:
        raise ReportError(exc.problem, exc.fix) from exc
    methods = {}
    for name, record in summary.methods.items():
        mdir = folder / "methods" / name
        for file in ("memories.jsonl", "answers.jsonl"):
            if not (mdir / file).is_file():
                raise ReportError(f"{mdir / file} is missing (method {name!r} of {path})",
                                  f"{_FIX}; or remove {name!r} from summary.json")
        answers = _read_answers(mdir / "answers.jsonl")
        got, want = sorted(str(a.get("id")) for a in answers), sorted(record.scores.ids)
        if got != want:
            raise ReportError(f"{mdir / 'answers.jsonl'}: its {len(got)} ids differ from the {len(want)} scored ids "
                              f"of methods.{name} in {path}", _FIX)
        methods[name] = Method(name, record, read_memories(mdir / "memories.jsonl"), answers)
    return summary, methods


# -- statistics ---------------------------------------------------------------------------------------


def _metric_names(methods: dict[str, Method]) -> list[str]:
    names = list(dict.fromkeys(k for m in methods.values() for k in m.record.scores.metrics))
    return sorted(names, key=lambda k: (METRIC_ORDER.index(k) if k in METRIC_ORDER else len(METRIC_ORDER), k))


def support_interval(record: SupportRecord | None, n_resamples: int, seed: int) -> dict[str, Any] | None:
    """Mean support with its bootstrap interval over the scored items (None when not measured)."""
    if record is None:
        return None
    values = [v for v in record.per_example if v is not None]
    if not values:
        return {"mean": None, "n": 0, "interval": None}
    ci = bootstrap_ci(values, n_resamples, seed=seed)
    return {"mean": float(np.mean(values)), "n": len(values), "interval": ci.to_dict()}


def _scored(record: MethodRecord, metric: str) -> tuple[MetricRecord | SupportRecord, list[str], list[str]] | None:
    """A method's record of ``metric`` (or of ``support``), the ids of its values and the ids it excluded."""
    if metric == "support":
        return (record.support, record.support.ids, []) if record.support else None
    found = record.scores.metrics.get(metric)
    return (found, record.scores.ids, record.scores.excluded_ids) if found else None


def paired_row(method: Method, reference: Method, metric: str, n_resamples: int = DEFAULT_RESAMPLES,
               seed: int = DEFAULT_SEED) -> dict[str, Any]:
    """``method`` minus ``reference`` on ``metric`` (or ``support``): :func:`memreader.eval.stats.paired_test` on the
    items both scored, none excluded by either; a pair that cannot be tested (not measured for both, different
    signatures, corpus-level BLEU, nothing in common) gets a ``note`` instead."""
    row: dict[str, Any] = {"method": method.name, "reference": reference.name, "metric": metric}
    a, b = _scored(method.record, metric), _scored(reference.record, metric)
    if a is None or b is None:
        return {**row, "note": "not measured for both"}
    (ra, ids_a, drop_a), (rb, ids_b, drop_b) = a, b
    if ra.signature != rb.signature:
        return {**row, "note": "signatures differ: not comparable"}
    if getattr(ra, "aggregation", "mean") == "corpus":
        return {**row, "note": "corpus-level BLEU: the paired test needs counts (memreader score --baseline)"}
    try:
        test = paired_test(ids_a, ra.per_example, ids_b, rb.per_example, [*drop_b, *drop_a], n_resamples, seed=seed)
    except NotComparable as err:
        return {**row, "note": str(err)}
    return {**row, **test.to_dict()}


def paired_comparisons(methods: dict[str, Method], reference: str = REFERENCE, n_resamples: int = DEFAULT_RESAMPLES,
                       seed: int = DEFAULT_SEED) -> list[dict[str, Any]]:
    """:func:`paired_row` of every method minus ``reference``, per metric and for support."""
    if reference not in methods:
        return []
    ref = methods[reference]
    return [paired_row(m, ref, metric, n_resamples, seed) for name, m in methods.items() if name != reference
            for metric in [*_metric_names({reference: ref, name: m}), "support"]]


@dataclass
class ReportStats:
    """The statistics computed here (the rest is read from summary.json)."""

    metrics: list[str]
    support: dict[str, dict[str, Any] | None]
    paired: list[dict[str, Any]]
    correlations: list[CorrelationRow]


def statistics(methods: dict[str, Method], n_resamples: int, seed: int) -> ReportStats:
    """Support intervals, paired tests against :data:`REFERENCE` and the correlation table."""
    return ReportStats(_metric_names(methods),
                       {n: support_interval(m.record.support, n_resamples, seed) for n, m in methods.items()},
                       paired_comparisons(methods, REFERENCE, n_resamples, seed),
                       correlation_table(methods, n_resamples, seed))


# -- figures ---------------------------------------------------------------------------------------------


def _bands(methods: dict[str, Method]) -> dict[str, tuple[float, float, float] | None]:
    cals = {n: m.record.calibration for n, m in methods.items()}
    band = lambda c: (c.target_chars, c.target_chars * (1 - c.tolerance),  # noqa: E731
                      c.target_chars * (1 + c.tolerance))
    shared = {band(c) for c in cals.values() if c}
    return {n: band(c) if c else (next(iter(shared)) if len(shared) == 1 else None) for n, c in cals.items()}


def _support_bounds(s: dict[str, Any]) -> tuple[Any, Any]:
    return (s["interval"]["low"], s["interval"]["high"]) if s["interval"] else (None, None)


def _figures(summary: EvalSummary, methods: dict[str, Method], stats: ReportStats, out: Path) -> dict[str, Path]:
    """``metrics.png`` (every metric and support with intervals) and ``chunk_lengths.png``."""
    from memreader.eval import plots

    panels: dict[str, list[plots.Bar]] = {}
    for k in stats.metrics:
        cells = {n: m.record.scores.metrics.get(k) for n, m in methods.items()}
        panels[_display(methods, k)] = [plots.Bar(n, c.value, c.ci_low, c.ci_high) if c else plots.Bar(n, None)
                                        for n, c in cells.items()]
    panels["Support (NLL, lower is better)"] = [plots.Bar(n, s["mean"], *_support_bounds(s)) if s
                                                else plots.Bar(n, None) for n, s in stats.support.items()]
    title = f"{summary.dataset.name}: 95% bootstrap intervals"
    return {"metrics.png": plots.metric_bars(panels, out / "metrics.png", title),
            "chunk_lengths.png": plots.chunk_histograms({n: m.chunk_lengths for n, m in methods.items()},
                                                        out / "chunk_lengths.png", _bands(methods))}


# -- Markdown --------------------------------------------------------------------------------------------


def _display(methods: dict[str, Method], metric: str) -> str:
    return next((m.record.scores.metrics[metric].metric for m in methods.values()
                 if metric in m.record.scores.metrics), None) or metric


def _header(folder: Path, summary: EvalSummary, n_resamples: int, seed: int) -> list[str]:
    ds = summary.dataset
    settings = " · ".join(str(v) if k == "line" else f"{k}={v}" for k, v in summary.settings.to_dict().items())
    return [f"# Evaluation report: {folder.parent.name}", "",
            f"Data set **{ds.name}** ({ds.n_questions} questions, `{ds.path}`) · answer model "
            f"`{summary.answer_model}` · embedder `{summary.embedder}` · top_k {summary.top_k} · {settings}", "",
            f"Intervals: 95% percentile bootstrap over questions ({n_resamples} resamples, seed {seed} for the ones "
            "computed here; metric intervals as recorded in summary.json). Signatures: last section.", ""]


def _qa_section(methods: dict[str, Method], metrics: list[str]) -> list[str]:
    rows = []
    for n, m in methods.items():
        r, p = m.record.scores.metrics, m.record.provenance
        rows.append([n, m.record.scores.n, *(value_ci(r[k].value, r[k].ci_low, r[k].ci_high) if k in r else "n/a"
                                            for k in metrics), p.memories, p.fallback, p.truncated])
    return ["## QA scores", "",
            *table(["method", "n", *(_display(methods, k) for k in metrics), "memories", "fallbacks", "truncated"],
                   rows),
            "Fallbacks: memories that are the whole document as one chunk because the model's reply was unusable; "
            "truncated: replies cut off by their budget and kept flagged.", "", "![metrics](metrics.png)", ""]


def _support_section(methods: dict[str, Method], support: dict[str, dict[str, Any] | None]) -> list[str]:
    return ["## Informational support", "",
            "S = -1/m sum log P(a_i | a_<i, prompt with the retrieved chunks) of the reference answer under the "
            "answering model (lower is better; eval/support.py).", "",
            *table(["method", "scored", "S [95% CI]", "truncated"], [
                [n, s["n"], value_ci(s["mean"], *_support_bounds(s), 3), methods[n].record.support.n_truncated]
                if s else [n, 0, "not measured", ""] for n, s in support.items()])]


def _calibration_section(methods: dict[str, Method]) -> list[str]:
    rows = []
    for n, m in methods.items():
        c, lengths = m.record.calibration, m.chunk_lengths
        achieved = f"{np.mean(lengths):.1f} ± {np.std(lengths):.1f}" if lengths else "n/a"
        rows.append([n, len(lengths), achieved, *((c.target_chars, f"±{c.tolerance:.0%}", c.within,
                    f"{c.param}={c.value}", c.note) if c else ("", "", "", "", "not calibrated"))])
    return ["## Chunk lengths and calibration", "", "![chunk lengths](chunk_lengths.png)", "",
            *table(["method", "chunks", "chars mean ± std", "target", "tolerance", "within", "setting", "note"], rows)]


def _cost_section(methods: dict[str, Method]) -> list[str]:
    """Wall time per phase and peak memory of every method, over all sessions that worked on it."""
    costs = {n: m.record.cost for n, m in methods.items()}
    if not any(costs.values()):
        return []
    order = {p: i for i, p in enumerate(("memories", "index", "answers", "clarity", "stickiness"))}
    phases = sorted({p for c in costs.values() if c for p in c.phases}, key=lambda p: (order.get(p, len(order)), p))
    rows = [[n, *(f"{c.phases.get(p, 0.0):.0f}" for p in phases), f"{c.seconds:.0f}", c.sessions,
             f"{c.peak_rss_mib:.0f}", c.rss_source] if c else [n, *([""] * len(phases)), "not recorded", "", "", ""]
            for n, c in costs.items()]
    return ["## Cost per method", "",
            "Wall seconds per phase, summed over every session that worked on the method (a resumed run adds up); "
            "peak memory: the largest resident memory of the eval's process tree (engine workers included) while "
            "the method ran.", "",
            *table(["method", *(f"{p} s" for p in phases), "total s", "sessions", "peak MiB", "measured by"], rows)]


def _paired_section(methods: dict[str, Method], paired: list[dict[str, Any]]) -> list[str]:
    md = [f"## Paired comparisons against {REFERENCE}", ""]
    if not paired:
        return [*md, f"No method named {REFERENCE!r} in this run, or no other method: nothing to compare.", ""]
    cells = lambda r: ((fmt(r["delta"]), interval(r["interval"]["low"], r["interval"]["high"]),  # noqa: E731
                        fmt(r["p_bootstrap"]), fmt(r["p_permutation"]), r["n"]) if "delta" in r
                       else (r["note"], "", "", "", ""))
    return [*md, "Δ = method − memreader on the items both scored (higher is better except support); paired "
            "bootstrap interval and p-value, sign-flip permutation p-value.", "",
            *table(["method", "metric", "Δ", "95% CI", "p_bootstrap", "p_permutation", "n"],
                   [[r["method"], _display(methods, r["metric"]), *cells(r)] for r in paired])]


def _retrieved_example(methods: dict[str, Method], per_method: int = 3, chars: int = 120) -> list[str]:
    """What each method retrieved for the first question: document, source file and pages, the chunk's start."""
    first = next((m.answers[0] for m in methods.values() if m.answers), None)
    if first is None:
        return []
    md = ["## What each method retrieved (first question)", "", f"Question `{first.get('id')}`: "
          f"{' '.join(str(first.get('question', '')).split())[:300]}", ""]
    rows = []
    for n, m in methods.items():
        answer = next((a for a in m.answers if a.get("id") == first.get("id")), {})
        hits = [h for h in answer.get("retrieved", []) if isinstance(h, dict)]
        for rank, hit in enumerate(hits[:per_method], start=1):
            text = " ".join(str(hit.get("text", "")).split())
            rows.append([n, rank, hit.get("doc_id"), describe_where(hit) or "-",
                         (text[:chars] + " ...") if len(text) > chars else text])
    return md + table(["method", "rank", "document", "source, pages, headings", "chunk"], rows)


def _paper_section(summary: EvalSummary, methods: dict[str, Method], stats: ReportStats) -> list[str]:
    """The paper's tables beside this run's numbers (:func:`memreader.eval.paper_tables.side_by_side`)."""
    corr = clarity_row(stats.correlations).correlation
    return paper.side_by_side(
        summary.dataset.name, summary.dataset.path,
        {n: {k: v.value for k, v in m.record.scores.metrics.items()} for n, m in methods.items()},
        {n: s["mean"] if s else None for n, s in stats.support.items()},
        (corr.pearson, corr.spearman, len(corr.methods)) if corr else None)


def _signatures_section(summary: EvalSummary, methods: dict[str, Method], metrics: list[str]) -> list[str]:
    sigs: dict[tuple[str, str], list[str]] = {}
    for n, m in methods.items():
        for k in metrics:
            if k in m.record.scores.metrics:
                sigs.setdefault((_display(methods, k), m.record.scores.metrics[k].signature), []).append(n)
        for key, measured in (("support", m.record.support), ("clarity", m.record.clarity),
                              ("stickiness", m.record.stickiness)):
            if measured:
                sigs.setdefault((key, measured.signature), []).append(n)
    return ["## Signatures", "", "Two numbers are comparable when their signatures are equal.", "",
            *(f"- {q} ({', '.join(ns)}): `{s}`" for (q, s), ns in sigs.items()), "",
            f"Run profile: forward share {fmt(summary.profile.forward_share, 3)}; seconds "
            + ", ".join(f"{k} {v}" for k, v in summary.profile.seconds.items()), ""]


# -- the report --------------------------------------------------------------------------------------------


def build_report(folder: Path, out: Path | None = None, n_resamples: int = DEFAULT_RESAMPLES,
                 seed: int = DEFAULT_SEED) -> tuple[Path, list[Path]]:
    """Write ``report.md``, the PNGs and ``report.json`` for the eval folder ``folder`` into ``out`` (default
    ``<folder>/report/``); returns the Markdown path and the figure paths."""
    out = out or folder / "report"
    summary, methods = load_run(folder)
    out.mkdir(parents=True, exist_ok=True)
    stats = statistics(methods, n_resamples, seed)
    figures = _figures(summary, methods, stats, out)
    clarity_md, clarity_fig = clarity_section(methods, stats.correlations, out)
    intrinsic_md, intrinsic_fig = intrinsic_section(methods, stats.correlations, out, n_resamples, seed)
    figures.update({name: fig for name, fig in (("clarity_rouge.png", clarity_fig),
                                                ("intrinsic_rouge.png", intrinsic_fig)) if fig is not None})
    md = [*_header(folder, summary, n_resamples, seed), *_qa_section(methods, stats.metrics),
          *_support_section(methods, stats.support), *_calibration_section(methods), *clarity_md, *intrinsic_md,
          *_cost_section(methods), *_paired_section(methods, stats.paired), *_retrieved_example(methods),
          *_paper_section(summary, methods, stats), *_signatures_section(summary, methods, stats.metrics)]
    path = write_atomic(out / "report.md", "\n".join(md) + "\n")
    write_json(out / "report.json", {"eval_dir": str(folder), "support": stats.support, "paired": stats.paired,
                                     "intrinsic_correlations": [r.to_dict() for r in stats.correlations],
                                     "figures": sorted(figures)})
    write_report_page(out / "report.html", md, out, methods, stats.metrics, title=md[0].lstrip("# "))
    return path, list(figures.values())


# -- command line -------------------------------------------------------------------------------------------


@dataclass
class ReportConfig:
    """Settings of ``memreader report``."""

    eval_run: str = config_field("", help="the evaluation: a run name under $MEMREADER_HOME/runs/ or the path of an "
                                 "eval folder (memreader report RUN)")
    out: str = config_field("", help="output folder (default: <eval folder>/report/)")
    bootstrap: int = config_field(DEFAULT_RESAMPLES, ge=1, help="bootstrap resamples")
    seed: int = config_field(DEFAULT_SEED, help="bootstrap seed")

    def problems(self) -> list[str]:
        return [] if self.eval_run else ["eval_run: name the evaluation run (memreader report RUN)"]


def _run_stage(cfg: ReportConfig) -> int:
    folder = eval_dir(cfg.eval_run)
    path, figures = build_report(folder, Path(cfg.out) if cfg.out else None, cfg.bootstrap, cfg.seed)
    print(f"report: {path} (figures: {', '.join(p.name for p in figures)}; page: {path.with_suffix('.html')})")
    return 0


STAGE = Stage("report", "Markdown report with plots of an evaluation run (memreader report RUN)", run=_run_stage,
              config=ReportConfig, example_dir="configs/eval/",
              flags=(Flag("eval_run", positional=True, help="run name under $MEMREADER_HOME/runs/, or the path of an "
                          "eval folder"), Flag("out"), Flag("bootstrap", int), Flag("seed", int)))

if __name__ == "__main__":
    from memreader.cli import module_main

    raise SystemExit(module_main("report"))
