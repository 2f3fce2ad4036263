"""Retrieval audits as one offline HTML page: ``memreader ask --html out.html`` (either pipeline).

    with Searcher(cfg) as s:
        result = s.meve(question)
        write_audit_page(s.index, question, result, "meve.html")     # or a list of layer Hits

MeVe: each phase's candidates with their scores and fate; layers: which lists found each hit; then every hit inside
its document. Documents come from the index itself (its chunk rows, by the hit's version), so the page shows what
was retrieved from, not a file that may have changed since.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from memreader.core.fusion import CHUNK, CORE, OUTLINE, Hit
from memreader.core.html_page import esc, page, write_page
from memreader.core.structure import describe_where, where_from_json
from memreader.retrieval.meve import MeVeResult
from memreader.retrieval.rows import VERSION_CHARS

CSS = """
tr.kept td:first-child{border-left:4px solid var(--ok)}tr.dropped td:first-child{border-left:4px solid var(--bad)}
tr.added td:first-child{border-left:4px solid var(--warn)}td.reason{color:var(--bad)}td.snippet{max-width:560px;
font-size:12px}.doc{border:1px solid var(--line);border-radius:6px;padding:8px;margin:8px 0}.doc mark.hit{
background:#fff3a3;outline:2px solid var(--warn)}.doc .gap{color:var(--muted)}.budget{font-weight:600}
.phase{margin-top:14px}.layers span.pill{margin-right:4px}
"""
_SNIPPET = 240


def _key(pid: str) -> tuple[str, int, str]:
    """(doc_id, scenario, version) of a chunk row's primary key ``chunk/<scenario>/<version>/<doc_id>``."""
    _layer, scenario, version, doc_id = pid.split("/", 3)
    return doc_id, int(scenario), version


def stored_documents(index: Any, versions: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Each document's stored scenarios, by doc_id, from the index's rows of the version asked for (the first
    ``VERSION_CHARS`` of its content hash): ``{"chunks": [(scenario, start, end, text)], "outline": {...},
    "core": {...}, "where": {...}}``."""
    out: dict[str, dict[str, Any]] = {}
    fields = ["layer", "doc_id", "scenario", "start", "end", "text", "doc_hash", "origin"]
    layers = f'layer in ["{CHUNK}", "{OUTLINE}", "{CORE}"]'
    rows = [r for doc_id in sorted(versions) for r in index.rows_where("doc_id", [doc_id], fields, also=layers)]
    for r in rows:
        if r["doc_hash"][:VERSION_CHARS] != versions[r["doc_id"]]:
            continue
        doc = out.setdefault(r["doc_id"], {"chunks": [], OUTLINE: {}, CORE: {}, "where": {}})
        scenario = int(r["scenario"])
        if r["layer"] == CHUNK:
            doc["chunks"].append((scenario, int(r["start"]), int(r["end"]), r["text"]))
            doc["where"][scenario] = where_from_json(r["origin"])
        else:
            doc[r["layer"]][scenario] = r["text"]
    for doc in out.values():
        doc["chunks"].sort()
    return out


def _document(doc_id: str, doc: dict[str, Any] | None, marks: dict[int, str]) -> str:
    """A document from its stored chunks, the chunks in ``marks`` (scenario -> anchor id) highlighted."""
    if doc is None:
        return f'<div class="doc bad">{esc(doc_id)}: no rows of this version in the index (updated since?)</div>'
    parts, pos = [], 0
    for scenario, start, end, text in doc["chunks"]:
        if start > pos:
            parts.append(f'<span class="gap" title="{start - pos} characters not indexed (whitespace)">⋯</span>')
        body = esc(text)
        if scenario in marks:
            body = f'<mark class="hit" id="{esc(marks[scenario])}" data-scenario="{scenario}">{body}</mark>'
        parts.append(body)
        pos = end
    return (f'<div class="doc"><div><b>{esc(doc_id)}</b> <span class="muted">{len(doc["chunks"])} chunks</span>'
            f'</div><div class="text">{"".join(parts)}</div></div>')


def _snippet(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _SNIPPET else flat[:_SNIPPET] + " …"


def _chunk_text(docs: dict[str, dict[str, Any]], pid: str) -> str:
    doc_id, scenario, _ = _key(pid)
    found = next((t for s, _a, _b, t in docs.get(doc_id, {}).get("chunks", []) if s == scenario), None)
    return _snippet(found) if found is not None else "(not in the index any more)"


def _fmt(v: Any) -> str:
    return f"{v:.4f}" if isinstance(v, float) else ("-" if v is None else str(v))


def _verifier(score: float | None) -> str:
    """The verifier's score of a passage, or that it was never scored (verify off, or a fallback passage phase 2
    did not see)."""
    return "not scored" if score is None else f"{score:.4f}"


def _rows(docs: dict[str, dict[str, Any]], entries: Sequence[dict[str, Any]], fate: str) -> str:
    """Table rows of one phase's candidates: fate, id, source and rank, similarity, verifier score, priority score,
    tokens, reason, text."""
    out = []
    for c in entries:
        cells = [fate, c["id"], f"{c.get('source', '')} #{c.get('rank', '')}", _fmt(c.get("similarity")),
                 _verifier(c.get("verifier_score")), _fmt(c.get("score")), _fmt(c.get("tokens"))]
        row = "".join(f"<td>{esc(x)}</td>" for x in cells)
        row += f'<td class="reason">{esc(c.get("reason", ""))}</td>'
        row += f'<td class="snippet">{esc(_chunk_text(docs, c["id"]))}</td>'
        out.append(f'<tr class="{fate.split()[0]}" data-id="{esc(c["id"])}">{row}</tr>')
    return "".join(out)


def _phase(title: str, summary: str, rows: str) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("fate", "passage", "source #rank", "similarity", "verifier score",
                                              "priority score", "tokens", "reason", "text"))
    body = f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>" if rows else ""
    return f'<section class="phase"><h2>{esc(title)}</h2><p>{esc(summary)}</p>{body}</section>'


def meve_page(result: MeVeResult, docs: dict[str, dict[str, Any]]) -> str:
    """The HTML page of one MeVe run (:meth:`MeVeResult.audit` and its passages)."""
    a = result.audit
    v, f, p, k = a["verify"], a["fallback"], a["prioritize"], a["pack"]
    # a kNN record is taken before phase 2 scores it: each row shows the candidate as phase 2 left it
    verified = {c["id"]: (c, "kept") for c in v["kept"]} | {c["id"]: (c, "dropped") for c in v["dropped"]}
    knn_rows = "".join(_rows(docs, [entry], fate) for entry, fate in
                       (verified.get(c["id"], (c, "unverified")) for c in a["knn"]["candidates"]))
    share = k.get("budget_share") or 0
    budget = (f"budget {k.get('budget', k['t_max'])} tokens ("
              + (f"{share} of the {k.get('offered')} tokens top-k offered, at most t_max {k['t_max']}" if share
                 else "t_max") + f"); context {a['tokens']} tokens" if k["enabled"] else "packing off: no budget")
    body = [f"<p><b>Question:</b> {esc(a['question'])}</p>",
            f"<p>Operating point: {esc(a.get('operating_point') or 'not recorded')}</p>",
            f'<p class="budget">{esc(budget)}</p>', f"<p class=muted><code>{esc(a['signature'])}</code></p>",
            _phase(f"1 kNN: {len(a['knn']['candidates'])} candidates (k={a['knn']['k']})",
                   "Every candidate of the vector search; fate = what phase 2 did with it.", knn_rows),
            _phase("2 verify", (f"kept {len(v['kept'])}, dropped {len(v['dropped'])} below tau {v['tau']} (verifier "
                                f"{a['verifier']}, {v['verifier_ms']:.0f} ms)") if v["enabled"] else
                   "off: every kNN candidate kept, not scored (priority score = cosine)",
                   _rows(docs, v["kept"], "kept") + _rows(docs, v["dropped"], "dropped")),
            _phase("3 fallback", f"{'fired' if f['fired'] else 'not fired'} ({f['reason']})",
                   _rows(docs, f["added"], "added by fallback")),
            _phase("4 prioritize", f"{len(p['order'])} ordered, {len(p['dropped'])} redundant (cos > "
                   f"{p['redundancy']})" if p["enabled"] else "off: phase order kept",
                   _rows(docs, p["order"], "kept") + _rows(docs, p["dropped"], "dropped")),
            _phase("5 pack", f"{len(k['packed'])} packed, {k['tokens']} tokens; {budget}",
                   _rows(docs, k["packed"], "kept") + _rows(docs, k["dropped"], "dropped")),
            "<h2>The context: each passage in its document</h2>"]
    body += _in_documents([(c.doc_id, _key(c.id)[1], c.where, f"score {c.score:.3f} · verifier "
                            f"{_verifier(c.verifier_score)} · {c.source} · {c.tokens} tokens")
                           for c in result.passages], docs)
    if not result.passages:
        body.append("<p class=bad>Empty context: no passage survived.</p>")
    return page("MeVe audit", "\n".join(body), css=CSS, subtitle=a["question"])


def _in_documents(items: Iterable[tuple[str, int, dict[str, Any] | None, str]],
                  docs: dict[str, dict[str, Any]]) -> list[str]:
    """A list of the hits ``(doc_id, scenario, where, line)`` (links to their anchors) and each document once, its
    hits highlighted."""
    marks: dict[str, dict[int, str]] = {}
    listed = []
    for i, (doc_id, scenario, where, line) in enumerate(items, start=1):
        anchor = f"hit-{i}"
        marks.setdefault(doc_id, {})[scenario] = anchor
        at = describe_where(where or {})
        listed.append(f'<li><a href="#{anchor}">[{i}] {esc(doc_id)} scenario {scenario}</a> {esc(line)}'
                      + (f' <span class="muted">@ {esc(at)}</span>' if at else "") + "</li>")
    return [f"<ol>{''.join(listed)}</ol>", *(_document(d, docs.get(d), m) for d, m in marks.items())]


def layers_page(question: str, hits: Sequence[Hit], docs: dict[str, dict[str, Any]], mode: str) -> str:
    """The HTML page of one layered search: which layer (dense or BM25 list) found each hit, and where."""
    rows = []
    for i, h in enumerate(hits, start=1):
        via = " ".join(f'<span class="pill">{esc(p.layer)} #{p.rank} {p.similarity:.3f}</span>' for p in h.provenance)
        d = docs.get(h.doc_id, {})
        rows.append(f'<tr data-rank="{i}"><td>{i}</td><td>{esc(h.doc_id)} / {h.scenario}</td><td>{h.score:.4f}</td>'
                    f'<td class="layers">{via}</td><td>{esc(d.get(OUTLINE, {}).get(h.scenario, ""))}</td>'
                    f'<td class="snippet">{esc(d.get(CORE, {}).get(h.scenario, ""))}</td>'
                    f'<td class="snippet">{esc(_snippet(h.text))}</td></tr>')
    head = "".join(f"<th>{x}</th>" for x in ("rank", "document / scenario", "RRF score", "found by (list #rank "
                                              "score)", "outline", "core", "chunk"))
    body = [f"<p><b>Question:</b> {esc(question)}</p>", f"<p>Mode <code>{esc(mode)}</code>: each list votes by "
            "reciprocal rank; BM25 scores are on their own scale.</p>",
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>",
            "<h2>Each hit in its document</h2>"]
    body += _in_documents([(h.doc_id, h.scenario, h.where, f"score {h.score:.4f}") for h in hits], docs)
    if not hits:
        body.append("<p class=bad>No results.</p>")
    return page("Retrieval: layers", "\n".join(body), css=CSS, subtitle=question)


def write_audit_page(index: Any, question: str, result: MeVeResult | Sequence[Hit], path: str | Path,
                     mode: str = "three_layer") -> Path:
    """Write the audit page of a MeVe result or of layer hits (documents read from ``index``)."""
    if isinstance(result, MeVeResult):
        ids = [c["id"] for c in result.audit["knn"]["candidates"]] + [c.id for c in result.passages]
        ids += [c["id"] for c in result.audit["fallback"]["added"]]
        versions = {doc: version for doc, _, version in map(_key, ids)}
        return write_page(path, meve_page(result, stored_documents(index, versions)))
    versions = {h.doc_id: h.provenance[0].version[:VERSION_CHARS] for h in result if h.provenance}
    return write_page(path, layers_page(question, list(result), stored_documents(index, versions), mode))


__all__ = ["layers_page", "meve_page", "stored_documents", "write_audit_page"]
