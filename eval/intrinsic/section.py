"""The report's sections on intrinsic chunk quality: "Atomic-chunk clarity vs ROUGE-L" (clarity per method and its
scatter against ROUGE-L) and "Intrinsic chunk quality (MoC)" (clarity, boundary clarity and stickiness per method,
the one correlation table of :mod:`memreader.eval.intrinsic.correlation`, each metric plotted against ROUGE-L).

    table = correlation_table(methods, n_resamples, seed)
    md, figure = clarity_section(methods, table, out_dir)       # figure: clarity_rouge.png or None
    md, figure = intrinsic_section(methods, table, out_dir, n_resamples, seed)   # intrinsic_rouge.png or None
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memreader.eval.intrinsic.correlation import INTRINSIC, MIN_METHODS, CorrelationRow
from memreader.eval.markdown import fmt, table, value_ci


def clarity_row(rows: Sequence[CorrelationRow]) -> CorrelationRow:
    """The clarity / ROUGE-L row of the correlation table (MoM Table 2)."""
    return next(r for r in rows if (r.intrinsic, r.qa) == ("clarity", "rouge_l"))


def clarity_section(methods: dict[str, Any], rows: Sequence[CorrelationRow], out: Path
                    ) -> tuple[list[str], Path | None]:
    """Markdown lines and ``clarity_rouge.png`` (None, and any earlier one removed, without a correlation)."""
    from memreader.eval import plots

    md = ["## Atomic-chunk clarity vs ROUGE-L", ""]
    md += table(["method", "mean clarity", "memories", "no boundary (single chunk)"], [
        [n, fmt(c.mean), len(c.per_memory), sum(v is None for v in c.per_memory)] if (c := m.record.clarity)
        else [n, "not measured", "", ""] for n, m in methods.items()])
    path = out / "clarity_rouge.png"
    path.unlink(missing_ok=True)  # never leave a stale scatter from an earlier report
    row = clarity_row(rows)
    corr = row.correlation
    if corr is None:
        return [*md, f"Correlation not computed: {row.note}.", ""], None
    md += ["Its correlation with ROUGE-L across methods is the `clarity | rouge_l` row of the correlation table in "
           "the next section; one point per method:", "", "![clarity vs ROUGE-L](clarity_rouge.png)", ""]
    points = dict(zip(corr.methods, zip(corr.clarity_means, corr.rouge_means, strict=True), strict=True))
    return md, plots.clarity_scatter(points, path, corr.pearson, corr.spearman)


def _measures_table(methods: dict[str, Any]) -> list[str]:
    rows = []
    for n, m in methods.items():
        c, s = m.record.clarity, m.record.stickiness
        edges = f"{sum(s.edges) / max(len(s.edges), 1):.1f}" if s else ""
        rows.append([n, len(c.doc_ids) if c else (len(s.doc_ids) if s else 0),
                     fmt(c.mean) if c else "not measured", fmt(c.boundary_clarity_mean) if c else "",
                     fmt(s.mean) if s else "not measured", edges, f"{s.threshold:.3f}" if s else "",
                     fmt(c.seconds, 1) if c and c.seconds is not None else "", fmt(s.seconds, 1) if s else ""])
    return table(["method", "memories", "clarity ↑", "boundary clarity ↑", "stickiness ↓", "edges / memory",
                  "cosine threshold", "clarity s", "stickiness s"], rows)


def _correlation_cells(row: CorrelationRow) -> list[Any]:
    c = row.correlation
    if c is None:
        return [row.note, "", ""]
    pi, si = c.pearson_interval, c.spearman_interval
    return [value_ci(c.pearson, pi.low, pi.high) if pi else fmt(c.pearson),
            value_ci(c.spearman, si.low, si.high) if si else fmt(c.spearman),
            f"{c.n_undefined['pearson']} / {c.n_undefined['spearman']}"]


def correlation_lines(rows: Sequence[CorrelationRow], n_resamples: int, seed: int) -> list[str]:
    """The correlation table in Markdown, with the filter and the resampling it was computed with."""
    md = [f"Correlation across methods, one point per method (`intrinsic_correlations` in report.json). A method "
          "enters a row when it has the QA metric and at least one defined value of the intrinsic metric (a memory "
          f"with more than one chunk); a row needs {MIN_METHODS} such methods. 95% bootstrap intervals: questions "
          f"(seed {seed}) and documents (seed {seed + 1}) resampled independently, {n_resamples} resamples, each "
          "draw shared by all methods; draws where a correlation is undefined (all methods tie on one axis) are "
          "counted and left out.", ""]
    return md + table(["intrinsic", "QA metric", "methods", "Pearson r [95% CI]", "Spearman rho [95% CI]",
                       "undefined draws (r / rho)"],
                      [[r.intrinsic, r.qa, len(r.methods), *_correlation_cells(r)] for r in rows])


def _against_rouge(methods: dict[str, Any]) -> dict[str, dict[str, tuple[float, float]]]:
    """Per intrinsic metric: method -> (its mean over the scored memories, its ROUGE-L)."""
    points: dict[str, dict[str, tuple[float, float]]] = {}
    for name, (better, get) in INTRINSIC.items():
        for n, m in methods.items():
            got = get(m.record)
            rouge = m.record.scores.metrics.get("rouge_l")
            values = [v for v in (got[1] if got else []) if v is not None]
            if values and rouge is not None:
                points.setdefault(f"{name} ({better} is better)", {})[n] = (sum(values) / len(values), rouge.value)
    return points


def intrinsic_section(methods: dict[str, Any], rows: Sequence[CorrelationRow], out: Path, n_resamples: int,
                      seed: int) -> tuple[list[str], Path | None]:
    """Markdown lines and ``intrinsic_rouge.png`` (None, and any earlier one removed, without 2 methods)."""
    from memreader.eval import plots

    md = ["## Intrinsic chunk quality (MoC)", "",
          "Measured on the chunks themselves, no question involved (eval/intrinsic/): **clarity** is the "
          "evaluator's atomic-chunk clarity; **boundary clarity** = ppl(q | previous chunk) / ppl(q), from the same "
          "forward passes (higher: cleaner boundaries); **stickiness** = structural entropy of each memory's graph "
          "of chunks whose cosine passes a quantile of unrelated (cross-document) chunk pairs (lower: chunks that "
          "stand on their own). Means over the scored memories; seconds = what computing them cost.", ""]
    md += _measures_table(methods) + correlation_lines(rows, n_resamples, seed)
    path = out / "intrinsic_rouge.png"
    path.unlink(missing_ok=True)  # never leave a stale plot from an earlier report
    points = {k: v for k, v in _against_rouge(methods).items() if len(v) >= 2}
    if not points:
        return md, None
    return [*md, "![intrinsic quality vs ROUGE-L](intrinsic_rouge.png)", ""], plots.intrinsic_scatter(points, path)
