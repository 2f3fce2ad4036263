"""``report.html``: an evaluation run's report as one offline page, and what each method retrieved per question.

    write_report_page(out / "report.html", markdown_lines, out, methods)    # build_report calls it

The page holds the same tables and plots as ``report.md`` (the Markdown rendered with raw HTML disabled, so text
from documents shows as written; the PNGs inlined as ``data:`` URIs), then one section per question: the reference
answers and, side by side per method, its prediction, its score on every metric (the best of the methods in bold)
and the chunks it retrieved with their document and source. So a reader can see why a method won or lost a question.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt

from memreader.core.html_page import esc, page, write_page
from memreader.core.structure import describe_where

CSS = """
.qa{display:grid;gap:10px;grid-template-columns:repeat(auto-fill,minmax(240px,1fr))}
.method{border:1px solid var(--line);border-radius:6px;padding:6px 8px;min-width:0;overflow-wrap:anywhere}.method h4{margin:0 0 4px}
.pred{background:var(--panel);padding:4px 6px;border-radius:4px;margin:4px 0}.scores td{font-size:12px}
.best{font-weight:700;color:var(--ok)}.chunk{font-size:12px;border-top:1px dashed var(--line);padding-top:3px;
margin-top:3px;white-space:pre-wrap}details.question{border-bottom:1px solid var(--line);padding:4px 0}
details.question>summary{cursor:pointer}.md img{max-width:100%}.ref{color:var(--ok)}
"""
_CHUNK_CHARS = 600


def _markdown_html(lines: Sequence[str], figures_dir: Path) -> str:
    """The report's Markdown as HTML, raw HTML escaped and its PNGs inlined."""
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = md.parse("\n".join(lines))
    for token in tokens:
        for child in token.children or []:
            if child.type == "image":
                src = str(child.attrGet("src") or "")
                path = figures_dir / src
                if "/" not in src and path.suffix == ".png" and path.is_file():
                    child.attrSet("src", "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode())
    return md.renderer.render(tokens, md.options, {})


def _scores(methods: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """method -> question id -> metric -> the question's score."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, m in methods.items():
        per = out.setdefault(name, {})
        for metric, rec in m.record.scores.metrics.items():
            for qid, value in zip(m.record.scores.ids, rec.per_example, strict=False):
                per.setdefault(str(qid), {})[metric] = value
    return out


def _references(answer: dict[str, Any]) -> list[str]:
    refs = answer.get("answers", answer.get("reference", []))
    return [str(r) for r in refs] if isinstance(refs, list) else [str(refs)]


def _question(qid: str, methods: dict[str, Any], answers: dict[str, dict[str, dict[str, Any]]],
              scores: dict[str, dict[str, dict[str, float]]], metrics: list[str], open_: bool) -> str:
    first = next(a[qid] for a in answers.values() if qid in a)
    best = {k: max((scores[n].get(qid, {}).get(k) for n in methods if scores[n].get(qid, {}).get(k) is not None),
                   default=None) for k in metrics}
    cols = []
    for name in methods:
        a = answers[name].get(qid)
        if a is None:
            cols.append(f'<div class="method"><h4>{esc(name)}</h4><p class="muted">not answered</p></div>')
            continue
        mine = scores[name].get(qid, {})
        rows = ""
        for k in metrics:
            value = mine.get(k)
            best_here = value is not None and value == best[k] and value > 0 and len(methods) > 1
            rows += (f'<tr><td>{esc(k)}</td><td class="num{" best" if best_here else ""}">'
                     f'{"-" if value is None else f"{value:.3f}"}</td></tr>')
        chunks = []
        for rank, hit in enumerate([h for h in a.get("retrieved", []) if isinstance(h, dict)], start=1):
            text = str(hit.get("text", ""))
            text = text if len(text) <= _CHUNK_CHARS else text[:_CHUNK_CHARS] + " …"
            at = describe_where(hit)
            chunks.append(f'<div class="chunk" data-rank="{rank}"><b>[{rank}] {esc(hit.get("doc_id"))}</b>'
                          + (f' <span class="muted">{esc(at)}</span>' if at else "") + f"\n{esc(text)}</div>")
        cols.append(f'<div class="method" data-method="{esc(name)}"><h4>{esc(name)}</h4>'
                    f'<div class="pred">{esc(a.get("prediction", ""))}</div><table class="scores">{rows}</table>'
                    f'{"".join(chunks) or "<p class=muted>nothing retrieved</p>"}</div>')
    refs = " | ".join(esc(r) for r in _references(first))
    return (f'<details class="question" data-id="{esc(qid)}"{" open" if open_ else ""}><summary><code>{esc(qid)}'
            f'</code> {esc(" ".join(str(first.get("question", "")).split()))}</summary>'
            f'<p class="ref">reference: {refs}</p><div class="qa">{"".join(cols)}</div></details>')


def write_report_page(path: Path, markdown: Sequence[str], figures_dir: Path, methods: dict[str, Any],
                      metrics: Sequence[str], title: str = "Evaluation report", open_first: int = 3) -> Path:
    """Write ``report.html``: the Markdown report, then per question each method's prediction, scores and chunks
    (``methods``: name -> :class:`memreader.eval.report.Method`)."""
    answers = {n: {str(a.get("id")): a for a in m.answers} for n, m in methods.items()}
    order = list(dict.fromkeys(qid for a in answers.values() for qid in a))
    scores = _scores(methods)
    sections = [_question(q, methods, answers, scores, list(metrics), i < open_first) for i, q in enumerate(order)]
    body = (f'<div class="md">{_markdown_html(markdown, figures_dir)}</div>'
            f'<h2 id="questions">Per question: what each method retrieved and answered ({len(order)})</h2>'
            f'<p class="muted">Best score of the methods on a question in bold; click a question to open it.</p>'
            + "".join(sections))
    return write_page(path, page(title, body, css=CSS))
