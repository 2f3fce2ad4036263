"""``memreader report RUN``: a Markdown report with PNG plots of one evaluation run.

    memreader report my-run                      # $MEMREADER_HOME/runs/my-run/eval/ -> .../eval/report/
    python -m memreader.eval.report artifacts/runs/my-run/eval --out /tmp/report

Reads ``<eval>/summary.json`` and ``<eval>/methods/<method>/{memories,answers}.jsonl`` (written by the
evaluation stage; layout in docs/EVALUATION.md, "Report") and writes ``report.md``, ``metrics.png``
(values with 95% intervals), ``chunk_lengths.png``, ``clarity_rouge.png`` (when three or more methods
have clarity) and ``report.json`` (the derived statistics: support intervals, paired tests, correlation).
Paired tests are every method minus ``memreader`` on the same items (:func:`eval.stats.paired_bootstrap`).
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
from memreader.eval.clarity import Correlation, correlate
from memreader.eval.intrinsic_report import INTRINSIC, by_id, intrinsic_section, method_rows
from memreader.eval.paper_tables import fmt as _f
from memreader.eval.paper_tables import md_table as _table
from memreader.eval.records import EvalSummary, MethodRecord, MetricRecord, SummaryError, SupportRecord
from memreader.eval.stats import DEFAULT_RESAMPLES, DEFAULT_SEED, bootstrap_ci, paired_bootstrap

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
    path = Path(run).expanduser()
    for candidate in (path, path / "eval"):
        if (candidate / "summary.json").is_file():
            return candidate
    named = memreader_home() / "runs" / run / "eval"
    if (named / "summary.json").is_file():
        return named
    raise ReportError(f"no summary.json in {path}, {path / 'eval'} or {named}",
                      "give a run name under $MEMREADER_HOME/runs/ or the path of an eval folder; run the "
                      "evaluation stage first")


def load_run(folder: Path) -> tuple[EvalSummary, dict[str, Method]]:
    """The checked summary (:meth:`eval.records.EvalSummary.read`) and every method's files, or
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
        answers = []
        for n, line in enumerate((mdir / "answers.jsonl").read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    answers.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ReportError(f"{mdir / 'answers.jsonl'}:{n}: not valid JSON ({exc})", _FIX) from exc
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


def paired_comparisons(methods: dict[str, Method], reference: str = REFERENCE, n_resamples: int = DEFAULT_RESAMPLES,
                       seed: int = DEFAULT_SEED) -> list[dict[str, Any]]:
    """Every method minus ``reference`` per metric and for support, on the items both scored
    (paired bootstrap interval and p-value, sign-flip permutation p-value). A pair that cannot be
    tested (different signatures, corpus-level BLEU, nothing in common) gets a ``note`` instead."""
    if reference not in methods:
        return []
    ref, out = methods[reference], []
    for name, m in methods.items():
        if name == reference:
            continue
        pairs: list[tuple[str, MetricRecord | SupportRecord | None, MetricRecord | SupportRecord | None, dict,
                          dict]] = []
        rs, ms = ref.record.scores, m.record.scores
        drop = [*rs.excluded_ids, *ms.excluded_ids]
        for metric in _metric_names({reference: ref, name: m}):
            a, b = ms.metrics.get(metric), rs.metrics.get(metric)
            pairs.append((metric, a, b, by_id(ms.ids, a.per_example, drop) if a else {},
                          by_id(rs.ids, b.per_example, drop) if b else {}))
        sa, sb = m.record.support, ref.record.support
        pairs.append(("support", sa, sb, by_id(sa.ids, sa.per_example) if sa else {},
                      by_id(sb.ids, sb.per_example) if sb else {}))
        for metric, a, b, va, vb in pairs:
            row: dict[str, Any] = {"method": name, "reference": reference, "metric": metric}
            common = [i for i in va if i in vb and va[i] is not None and vb[i] is not None]
            if a is None or b is None:
                row["note"] = "not measured for both"
            elif a.signature != b.signature:
                row["note"] = "signatures differ: not comparable"
            elif getattr(a, "aggregation", "mean") == "corpus":
                row["note"] = "corpus-level BLEU: the paired test needs counts (memreader score --baseline)"
            elif not common:
                row["note"] = "no item scored for both"
            else:
                test = paired_bootstrap([va[i] for i in common], [vb[i] for i in common], n_resamples, seed=seed)
                row.update(test.to_dict())
            out.append(row)
    return out


def correlation(methods: dict[str, Method], n_resamples: int, seed: int) -> tuple[Correlation | None, str]:
    """Clarity vs ROUGE-L across the methods that have clarity, or None and why not."""
    have = {n: m for n, m in methods.items() if m.record.clarity and m.record.clarity.mean is not None
            and "rouge_l" in m.record.scores.metrics}
    if len(have) < 3:
        return None, (f"needs at least 3 methods with clarity and ROUGE-L; this run has {len(have)}"
                      f"{' (' + ', '.join(have) + ')' if have else ''}")
    return correlate(method_rows(have, INTRINSIC["clarity"][1], "rouge_l"), n_resamples, seed), ""


# -- Markdown --------------------------------------------------------------------------------------------


def _ci(value: Any, low: Any, high: Any, digits: int = 4) -> str:
    return f"{_f(value, digits)} [{_f(low, digits)}, {_f(high, digits)}]"


def _display(methods: dict[str, Method], metric: str) -> str:
    return next((m.record.scores.metrics[metric].metric for m in methods.values()
                 if metric in m.record.scores.metrics), None) or metric


def _bands(methods: dict[str, Method]) -> dict[str, tuple[float, float, float] | None]:
    cals = {n: m.record.calibration for n, m in methods.items()}
    band = lambda c: (c.target_chars, c.target_chars * (1 - c.tolerance),  # noqa: E731
                      c.target_chars * (1 + c.tolerance))
    shared = {band(c) for c in cals.values() if c}
    return {n: band(c) if c else (next(iter(shared)) if len(shared) == 1 else None) for n, c in cals.items()}


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
    return md + _table(["method", "rank", "document", "source, pages, headings", "chunk"], rows)


def build_report(folder: Path, out: Path, n_resamples: int = DEFAULT_RESAMPLES,
                 seed: int = DEFAULT_SEED) -> tuple[Path, list[Path]]:
    """Write ``report.md``, the PNGs and ``report.json`` for the eval folder ``folder`` into ``out``;
    returns the Markdown path and the figure paths."""
    from memreader.eval import plots

    summary, methods = load_run(folder)
    out.mkdir(parents=True, exist_ok=True)
    metrics = _metric_names(methods)
    support = {n: support_interval(m.record.support, n_resamples, seed) for n, m in methods.items()}
    paired = paired_comparisons(methods, REFERENCE, n_resamples, seed)
    corr, why = correlation(methods, n_resamples, seed)
    ds = summary.dataset
    panels: dict[str, list[plots.Bar]] = {}
    for k in metrics:
        cells = {n: m.record.scores.metrics.get(k) for n, m in methods.items()}
        panels[_display(methods, k)] = [plots.Bar(n, c.value, c.ci_low, c.ci_high) if c else plots.Bar(n, None)
                                        for n, c in cells.items()]
    panels["Support (NLL, lower is better)"] = [
        plots.Bar(n, s["mean"], *((s["interval"]["low"], s["interval"]["high"]) if s["interval"] else (None, None)))
        if s else plots.Bar(n, None) for n, s in support.items()]
    figures = {"metrics.png": plots.metric_bars(panels, out / "metrics.png", f"{ds.name}: 95% bootstrap intervals"),
               "chunk_lengths.png": plots.chunk_histograms({n: m.chunk_lengths for n, m in methods.items()},
                                                           out / "chunk_lengths.png", _bands(methods))}
    (out / "clarity_rouge.png").unlink(missing_ok=True)  # never leave a stale scatter from an earlier report
    if corr is not None:
        figures["clarity_rouge.png"] = plots.clarity_scatter(
            dict(zip(corr.methods, zip(corr.clarity_means, corr.rouge_means, strict=True), strict=True)),
            out / "clarity_rouge.png", corr.pearson, corr.spearman)

    settings = " · ".join(str(v) if k == "line" else f"{k}={v}" for k, v in summary.settings.to_dict().items())
    md = [f"# Evaluation report: {folder.parent.name}", "",
          f"Data set **{ds.name}** ({ds.n_questions} questions, `{ds.path}`) · answer model "
          f"`{summary.answer_model}` · embedder `{summary.embedder}` · top_k {summary.top_k} · {settings}", "",
          f"Intervals: 95% percentile bootstrap over questions ({n_resamples} resamples, seed {seed} for the ones "
          "computed here; metric intervals as recorded in summary.json). Signatures: last section.", "",
          "## QA scores", ""]
    rows = []
    for n, m in methods.items():
        r, p = m.record.scores.metrics, m.record.provenance
        rows.append([n, m.record.scores.n, *(_ci(r[k].value, r[k].ci_low, r[k].ci_high) if k in r else "n/a"
                                            for k in metrics), p.memories, p.fallback, p.truncated])
    md += _table(["method", "n", *(_display(methods, k) for k in metrics), "memories", "fallbacks", "truncated"], rows)
    md += ["Fallbacks: memories that are the whole document as one chunk because the model's reply was unusable; "
           "truncated: replies cut off by their budget and kept flagged.", "", "![metrics](metrics.png)", "",
           "## Informational support", "",
           "S = -1/m sum log P(a_i | a_<i, prompt with the retrieved chunks) of the reference answer under the "
           "answering model (lower is better; eval/support.py).", ""]
    md += _table(["method", "scored", "S [95% CI]", "truncated"], [
        [n, s["n"], _ci(s["mean"], *((s["interval"]["low"], s["interval"]["high"]) if s["interval"] else (None,) * 2),
                        3), methods[n].record.support.n_truncated] if s else [n, 0, "not measured", ""]
        for n, s in support.items()])
    md += ["## Chunk lengths and calibration", "", "![chunk lengths](chunk_lengths.png)", ""]
    cal_rows = []
    for n, m in methods.items():
        c, lengths = m.record.calibration, m.chunk_lengths
        achieved = f"{np.mean(lengths):.1f} ± {np.std(lengths):.1f}" if lengths else "n/a"
        cal_rows.append([n, len(lengths), achieved, *((c.target_chars, f"±{c.tolerance:.0%}", c.within,
                        f"{c.param}={c.value}", c.note) if c else ("", "", "", "", "not calibrated"))])
    md += _table(["method", "chunks", "chars mean ± std", "target", "tolerance", "within", "setting", "note"], cal_rows)
    md += ["## Atomic-chunk clarity vs ROUGE-L", ""]
    md += _table(["method", "mean clarity", "memories", "no boundary (single chunk)"], [
        [n, _f(c.mean), len(c.per_memory), sum(v is None for v in c.per_memory)] if (c := m.record.clarity)
        else [n, "not measured", "", ""] for n, m in methods.items()])
    if corr is None:
        md += [f"Correlation not computed: {why}.", ""]
    else:
        pi, si = corr.pearson_interval, corr.spearman_interval
        md += _table(["", "value", "95% CI", "undefined draws"], [
            ["Pearson r", _f(corr.pearson), f"[{_f(pi.low)}, {_f(pi.high)}]" if pi else "n/a", corr.n_undefined["pearson"]],
            ["Spearman rho", _f(corr.spearman), f"[{_f(si.low)}, {_f(si.high)}]" if si else "n/a",
             corr.n_undefined["spearman"]]])
        md += [f"Resampled: {corr.resampled}.", "", "![clarity vs ROUGE-L](clarity_rouge.png)", ""]
    intrinsic_md, intrinsic_corr, intrinsic_fig = intrinsic_section(methods, out, n_resamples, seed)
    md += intrinsic_md
    if intrinsic_fig is not None:
        figures["intrinsic_rouge.png"] = intrinsic_fig
    md += _cost_section(methods)
    md += [f"## Paired comparisons against {REFERENCE}", ""]
    if not paired:
        md += [f"No method named {REFERENCE!r} in this run, or no other method: nothing to compare.", ""]
    else:
        md += ["Δ = method − memreader on the items both scored (higher is better except support); paired bootstrap "
               "interval and p-value, sign-flip permutation p-value.", ""]
        md += _table(["method", "metric", "Δ", "95% CI", "p_bootstrap", "p_permutation", "n"], [
            [r["method"], _display(methods, r["metric"]), *((_f(r["delta"]), f"[{_f(r['interval']['low'])}, {_f(r['interval']['high'])}]",
                                          _f(r["p_bootstrap"]), _f(r["p_permutation"]), r["n"]) if "delta" in r
                                         else (r["note"], "", "", "", ""))] for r in paired])
    md += _retrieved_example(methods)
    md += paper.side_by_side(
        ds.name, ds.path, {n: {k: v.value for k, v in m.record.scores.metrics.items()} for n, m in methods.items()},
        {n: s["mean"] if s else None for n, s in support.items()},
        (corr.pearson, corr.spearman, len(corr.methods)) if corr else None)
    md += ["## Signatures", "", "Two numbers are comparable when their signatures are equal.", ""]
    sigs: dict[tuple[str, str], list[str]] = {}
    for n, m in methods.items():
        for k in metrics:
            if k in m.record.scores.metrics:
                sigs.setdefault((_display(methods, k), m.record.scores.metrics[k].signature), []).append(n)
        for key, measured in (("support", m.record.support), ("clarity", m.record.clarity),
                              ("stickiness", m.record.stickiness)):
            if measured:
                sigs.setdefault((key, measured.signature), []).append(n)
    md += [f"- {q} ({', '.join(ns)}): `{s}`" for (q, s), ns in sigs.items()] + [""]
    md += [f"Run profile: forward share {_f(summary.profile.forward_share, 3)}; seconds "
           + ", ".join(f"{k} {v}" for k, v in summary.profile.seconds.items()), ""]
    path = write_atomic(out / "report.md", "\n".join(md) + "\n")
    write_json(out / "report.json", {"eval_dir": str(folder), "support": support, "paired": paired,
                                     "correlation": corr.to_dict() if corr else {"note": why},
                                     "intrinsic_correlations": intrinsic_corr,
                                     "figures": sorted(figures)})
    return path, list(figures.values())


def _cost_section(methods: dict[str, Any]) -> list[str]:
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
            *_table(["method", *(f"{p} s" for p in phases), "total s", "sessions", "peak MiB", "measured by"], rows)]


def write_report(folder: str | Path, out: str | Path | None = None, n_resamples: int = DEFAULT_RESAMPLES,
                 seed: int = DEFAULT_SEED) -> Path:
    """:func:`build_report` of an eval folder into ``out`` (default ``<folder>/report/``); the Markdown path."""
    folder = Path(folder)
    return build_report(folder, Path(out) if out else folder / "report", n_resamples, seed)[0]


# -- command line -------------------------------------------------------------------------------------------


@dataclass
class ReportConfig:
    """Settings of ``memreader report``."""

    eval_run: str = config_field("", help="the evaluation: a run name under $MEMREADER_HOME/runs/ or the path of an "
                                 "eval folder (memreader report RUN)")
    out: str = config_field("", help="output folder (default: <eval folder>/report/)")
    bootstrap: int = config_field(DEFAULT_RESAMPLES, ge=1, help="bootstrap resamples")
    seed: int = config_field(DEFAULT_SEED, help="bootstrap seed")

    def check(self) -> list[str]:
        return [] if self.eval_run else ["eval_run: name the evaluation run (memreader report RUN)"]


def _run_stage(cfg: ReportConfig) -> int:
    folder = eval_dir(cfg.eval_run)
    path, figures = build_report(folder, Path(cfg.out) if cfg.out else folder / "report", cfg.bootstrap, cfg.seed)
    print(f"report: {path} (figures: {', '.join(p.name for p in figures)})")
    return 0


STAGE = Stage("report", "Markdown report with plots of an evaluation run (memreader report RUN)", run=_run_stage,
              config=ReportConfig, example_dir="configs/eval/",
              flags=(Flag("eval_run", positional=True, help="run name under $MEMREADER_HOME/runs/, or the path of an "
                          "eval folder"), Flag("out"), Flag("bootstrap", int), Flag("seed", int)))

if __name__ == "__main__":
    from memreader.cli import module_main

    raise SystemExit(module_main("report"))
