"""Align ``head[MASK]tail`` chunk markers to exact spans that tile the document.

Rules (docs/ARCHITECTURE.md, "Span alignment"): markers are matched literally (``str.find``, and ``re.escape``
where a junction allows whitespace, so no escaping accidents), each search starts after the previous boundary
(monotonic, so a repeated head cannot jump backwards), a fuzzy match with a score threshold is the fallback, text
between a tail and the next head goes to a neighbour, and a marker that cannot be placed at all is merged into the
chunk before it. The result always tiles the document; nothing is invented and no LLM is asked.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field

from rapidfuzz import fuzz


@dataclass
class Alignment:
    """Spans that tile the document, which markers each span absorbed, and a coverage report."""

    spans: list[tuple[int, int]]
    groups: list[list[int]]
    methods: list[str]
    report: dict = field(default_factory=dict)


def _is_filler(text: str) -> bool:
    """Only whitespace and punctuation: text whose side of a boundary carries no meaning."""
    return all(c.isspace() or unicodedata.category(c).startswith("P") for c in text)


def _find_junction(doc: str, tail: str, head: str, lower: int) -> int:
    """Smallest head start ``p >= lower`` where ``tail``, optional whitespace and ``head`` meet; -1 if none.

    Markers are stripped by the parser, so whitespace between two chunks is allowed here and
    goes to the earlier chunk (the boundary is where the next head starts).
    """
    if not head or not tail:
        return -1
    pat = re.compile(re.escape(tail) + r"(\s*)" + re.escape(head))
    pos = max(0, lower - len(tail) - 64)
    while True:
        m = pat.search(doc, pos)
        if m is None:
            return -1
        p = m.start(1) + len(m.group(1))
        if p >= lower:
            return p
        pos = m.start() + 1


def _find_tail_end(doc: str, tail: str, search_from: int, lower: int) -> int:
    """Smallest end position ``>= lower`` of ``tail`` searched from ``search_from``; -1 if none."""
    if not tail:
        return -1
    idx = doc.find(tail, max(search_from, lower - len(tail)))
    return idx + len(tail) if idx >= 0 else -1


def _fuzzy(doc: str, needle: str, lo: int, window: int, threshold: float) -> tuple[int, float]:
    """Best fuzzy start of ``needle`` in ``doc[lo:lo+window]`` (start, score) or (-1, score)."""
    if len(needle) < 3 or lo >= len(doc):
        return -1, 0.0
    res = fuzz.partial_ratio_alignment(needle, doc[lo : lo + window], score_cutoff=threshold)
    if res is None:
        return -1, 0.0
    return lo + res.dest_start, float(res.score)


def align_markers(document: str, markers: list[tuple[str, str]], fuzzy_threshold: float = 85.0,
                  fuzzy_window: int = 20000) -> Alignment:
    """Turn ``(head, tail)`` markers into tiling spans of ``document``.

    ``fuzzy_threshold`` is rapidfuzz's 0-100 partial-ratio score a fuzzy head/tail must reach;
    ``fuzzy_window`` bounds the characters searched after the previous boundary.
    """
    n_doc = len(document)
    if n_doc == 0 or not markers:
        report = {"markers": len(markers), "chunks": 0, "merged": len(markers), "coverage_exact": 1.0 if n_doc == 0 else 0.0}
        if n_doc and not markers:
            # Nothing to align against: one chunk, loudly marked as such.
            return Alignment([(0, n_doc)], [[]], ["whole-document"], {**report, "chunks": 1})
        return Alignment([], [], [], report)

    head0 = markers[0][0]
    lead = document.find(head0) if head0 else -1
    gap_chars = 0
    if lead < 0:
        start_method = "forced"
    elif _is_filler(document[:lead]):
        start_method = "exact"
    else:
        start_method, gap_chars = "exact+leading-gap", lead

    boundaries = [0]
    groups: list[list[int]] = [[0]]
    methods = [start_method]
    cur_head_end = (lead + len(head0)) if lead >= 0 else 0
    cur_head_matched = lead >= 0 and bool(head0)
    cur_tail = markers[0][1]
    for j in range(1, len(markers)):
        head, tail = markers[j]
        prev = boundaries[-1]
        lower = max(prev + 1, cur_head_end)
        p, method, gap = _place(document, cur_tail, head, prev, lower, fuzzy_window, fuzzy_threshold)
        gap_chars += gap
        if p < 0 or p >= n_doc:
            groups[-1].append(j)  # cannot place this marker: its scenario joins the previous chunk
            cur_tail = tail or cur_tail
            continue
        boundaries.append(p)
        groups.append([j])
        methods.append(method)
        cur_head_matched = bool(head) and document.startswith(head, p)
        cur_head_end = p + len(head) if cur_head_matched else p + 1
        cur_tail = tail

    spans, report = _close(document, boundaries, methods, cur_tail, cur_head_end, cur_head_matched, gap_chars)
    report = {"markers": len(markers), "chunks": len(spans), "merged": len(markers) - len(spans), **report}
    return Alignment(spans, groups, methods, report)


def _place(document: str, cur_tail: str, head: str, prev: int, lower: int, fuzzy_window: int,
           fuzzy_threshold: float) -> tuple[int, str, int]:
    """Where the chunk after ``cur_tail`` and starting with ``head`` begins (at or after ``lower``):
    (position or -1, how it was found, characters of disagreement between head and tail)."""
    n_doc = len(document)
    gap_chars = 0
    p = _find_junction(document, cur_tail, head, lower)
    method = "junction"
    if p < 0:
        hp = document.find(head, lower) if head else -1
        te = _find_tail_end(document, cur_tail, prev, lower)
        if hp >= 0 and te >= 0 and te <= hp and _is_filler(document[te:hp]):
            # Only blanks or punctuation between (a tail missing its final "."): the head is
            # exact and the filler stays with the earlier chunk.
            p, method = hp, "head"
        elif hp >= 0 and te >= 0:
            # Real disagreement: take the earlier position, so a head repeated far ahead cannot
            # swallow the text in between; the boundary is not counted as exact.
            p = min(hp, te)
            method = "head-disputed" if p == hp else "tail-disputed"
            gap_chars += abs(hp - te)
        elif hp >= 0 or te >= 0:
            p, method = (hp, "head") if hp >= 0 else (te, "tail")
    if p < 0:
        hp, hs = _fuzzy(document, head, lower, fuzzy_window, fuzzy_threshold)
        tp, ts = _fuzzy(document, cur_tail, prev, fuzzy_window, fuzzy_threshold)
        te = tp + len(cur_tail) if tp >= 0 else -1
        cands = [c for c in [(hs, hp, "fuzzy-head"), (ts, te, "fuzzy-tail")] if c[1] >= lower]
        if cands:
            _, p, method = max(cands)
    if p >= 0 and method.startswith(("tail", "fuzzy-tail")):
        while p < n_doc and document[p].isspace():
            p += 1  # same convention as a junction: whitespace after a tail stays with it
    return p, method, gap_chars


def _close(document: str, boundaries: list[int], methods: list[str], cur_tail: str, cur_head_end: int,
           cur_head_matched: bool, gap_chars: int) -> tuple[list[tuple[int, int]], dict]:
    """The spans from the boundaries, and the report's counts (methods, gap, exact coverage)."""
    n_doc = len(document)
    # The last chunk runs to the end of the document: look for its tail's *last* occurrence (a
    # short last chunk has no tail; then its head, when it matched, marks where its text ends).
    if cur_tail:
        idx = document.rfind(cur_tail, boundaries[-1])
        tail_end = idx + len(cur_tail) if idx >= 0 else -1
    else:
        tail_end = cur_head_end if cur_head_matched else -1
    end_exact = tail_end >= 0 and _is_filler(document[tail_end:])
    if tail_end >= 0 and not end_exact:
        gap_chars += n_doc - tail_end
    spans = [(b, boundaries[i + 1] if i + 1 < len(boundaries) else n_doc) for i, b in enumerate(boundaries)]
    exact_starts = {i for i, m in enumerate(methods) if m in ("junction", "head", "tail", "exact")}
    exact_chars = sum(e - s for i, (s, e) in enumerate(spans)
                      if i in exact_starts and ((i + 1 in exact_starts) if i + 1 < len(spans) else end_exact))
    return spans, {"methods": {m: methods.count(m) for m in sorted(set(methods))}, "gap_chars": gap_chars,
                   "coverage_exact": round(exact_chars / n_doc, 6)}
