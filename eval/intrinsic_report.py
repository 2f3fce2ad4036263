"""The report's "Intrinsic chunk quality" section: clarity, boundary clarity and stickiness per method, their
correlation with the QA metrics across methods (with bootstrap intervals, eval/clarity.py's ``correlate``), and a
plot of each against ROUGE-L.

    md, corr, figure = intrinsic_section(methods, out_dir, n_resamples, seed)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from memreader.eval.clarity import CorrelationError, MethodRow, correlate
from memreader.eval.paper_tables import fmt as _f
from memreader.eval.paper_tables import md_table as _table

#: name -> (what is better, getter of (doc_ids, per-memory values) from a method record, or None)
INTRINSIC: dict[str, tuple[str, Callable[[Any], tuple[list[str], list[float | None]] | None]]] = {
    "clarity": ("higher", lambda r: (r.clarity.doc_ids, r.clarity.per_memory) if r.clarity else None),
    "boundary clarity": ("higher", lambda r: (r.clarity.doc_ids, r.clarity.boundary_clarity)
                         if r.clarity and r.clarity.boundary_clarity is not None else None),
    "stickiness": ("lower", lambda r: (r.stickiness.doc_ids, list(r.stickiness.per_memory)) if r.stickiness else None),
}
QA = ("bleu_1", "rouge_l", "meteor")


def by_id(ids: Sequence[Any], values: Sequence[Any], drop: Sequence[Any] = ()) -> dict[str, Any]:
    """``values`` keyed by their ids (as strings), those in ``drop`` left out."""
    skip = {str(i) for i in drop}
    return {str(i): v for i, v in zip(ids, values, strict=True) if str(i) not in skip}


def method_rows(have: dict[str, Any], get: Callable[[Any], tuple[list[str], list[float | None]] | None],
                qa: str) -> list[MethodRow]:
    """:func:`eval.clarity.correlate`'s rows: each method's ``qa`` metric per question (the questions every method
    scored, none excluded anywhere) and ``get``'s per-document values (aligned on the union of documents)."""
    drop = {i for m in have.values() for i in m.record.scores.excluded_ids}
    per_q = {n: by_id(m.record.scores.ids, m.record.scores.metrics[qa].per_example, drop) for n, m in have.items()}
    questions = [i for i in next(iter(per_q.values())) if all(i in v for v in per_q.values())]
    docs = list(dict.fromkeys(d for m in have.values() for d in get(m.record)[0]))
    return [MethodRow(n, [per_q[n][i] for i in questions], [by_id(*get(m.record)).get(d) for d in docs])
            for n, m in have.items()]


def intrinsic_correlations(methods: dict[str, Any], n_resamples: int, seed: int) -> list[dict[str, Any]]:
    """One row per (intrinsic metric, QA metric): Pearson and Spearman across methods with intervals, or why not."""
    rows = []
    for name, (_, get) in INTRINSIC.items():
        for qa in QA:
            have = {n: m for n, m in methods.items() if get(m.record) and qa in m.record.scores.metrics}
            row: dict[str, Any] = {"intrinsic": name, "qa": qa, "methods": sorted(have)}
            if len(have) < 3:
                rows.append({**row, "note": f"needs 3 methods with both, has {len(have)}"})
                continue
            try:
                corr = correlate(method_rows(have, get, qa), n_resamples, seed)
            except CorrelationError as err:
                rows.append({**row, "note": str(err)})
                continue
            rows.append({**row, **corr.to_dict()})
    return rows


def intrinsic_section(methods: dict[str, Any], out: Path, n_resamples: int, seed: int
                      ) -> tuple[list[str], list[dict[str, Any]], Path | None]:
    """Markdown lines, the correlation rows and the plot (``intrinsic_rouge.png``, None without 2 methods)."""
    from memreader.eval import plots

    md = ["## Intrinsic chunk quality (MoC)", "",
          "Measured on the chunks themselves, no question involved (eval/intrinsic.py): **clarity** is the "
          "evaluator's atomic-chunk clarity; **boundary clarity** = ppl(q | previous chunk) / ppl(q), from the same "
          "forward passes (higher: cleaner boundaries); **stickiness** = structural entropy of each memory's graph "
          "of chunks whose cosine passes a quantile of unrelated (cross-document) chunk pairs (lower: chunks that "
          "stand on their own). Means over the scored memories; seconds = what computing them cost.", ""]
    table = []
    for n, m in methods.items():
        r = m.record
        c, s = r.clarity, r.stickiness
        edges = f"{sum(s.edges) / max(len(s.edges), 1):.1f}" if s else ""
        table.append([n, len(c.doc_ids) if c else (len(s.doc_ids) if s else 0),
                      _f(c.mean) if c else "not measured", _f(c.boundary_clarity_mean) if c else "",
                      _f(s.mean) if s else "not measured", edges, f"{s.threshold:.3f}" if s else "",
                      _f(c.seconds, 1) if c and c.seconds is not None else "", _f(s.seconds, 1) if s else ""])
    md += _table(["method", "memories", "clarity ↑", "boundary clarity ↑", "stickiness ↓", "edges / memory",
                  "cosine threshold", "clarity s", "stickiness s"], table)
    corr = intrinsic_correlations(methods, n_resamples, seed)
    md += ["Correlation across methods (one point per method; 95% bootstrap intervals over questions and documents, "
           "paired across methods):", ""]
    md += _table(["intrinsic", "QA metric", "methods", "Pearson r [95% CI]", "Spearman rho [95% CI]"], [
        [r["intrinsic"], r["qa"], len(r["methods"]), *((
            f"{_f(r['pearson'])} [{_f(r['pearson_interval']['low'])}, {_f(r['pearson_interval']['high'])}]"
            if r.get("pearson_interval") else _f(r["pearson"]),
            f"{_f(r['spearman'])} [{_f(r['spearman_interval']['low'])}, {_f(r['spearman_interval']['high'])}]"
            if r.get("spearman_interval") else _f(r["spearman"])) if "pearson" in r else (r["note"], ""))]
        for r in corr])
    points: dict[str, dict[str, tuple[float, float]]] = {}
    for name, (better, get) in INTRINSIC.items():
        for n, m in methods.items():
            got = get(m.record)
            rouge = m.record.scores.metrics.get("rouge_l")
            values = [v for v in (got[1] if got else []) if v is not None]
            if values and rouge is not None:
                points.setdefault(f"{name} ({better} is better)", {})[n] = (sum(values) / len(values), rouge.value)
    path = out / "intrinsic_rouge.png"
    path.unlink(missing_ok=True)  # never leave a stale plot from an earlier report
    figure = None
    if any(len(p) >= 2 for p in points.values()):
        figure = plots.intrinsic_scatter({k: v for k, v in points.items() if len(v) >= 2}, path)
        md += ["![intrinsic quality vs ROUGE-L](intrinsic_rouge.png)", ""]
    return md, corr, figure
