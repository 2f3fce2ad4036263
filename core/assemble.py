"""From raw model output to a validated :class:`DocumentMemory`: parse, align, merge, check."""

from __future__ import annotations

import logging
from typing import Any

from memreader.core.aligner import align_markers
from memreader.core.parser import ParsedOutput, ParseError, parse_output
from memreader.core.schema import DocumentMemory, Scenario

log = logging.getLogger(__name__)


def _memory(doc_id: str, document: str, scenarios: list[Scenario], reasoning: str | None,
            meta: dict[str, Any] | None, **info: Any) -> DocumentMemory:
    """A validated memory whose meta is ``meta`` plus ``info``."""
    mem = DocumentMemory(doc_id, document, scenarios, reasoning, {**(meta or {}), **info})
    mem.validate()
    return mem


def memory_from_parsed(doc_id: str, document: str, parsed: ParsedOutput, meta: dict[str, Any] | None = None,
                       fuzzy_threshold: float = 85.0) -> DocumentMemory:
    """Align parsed markers to the document; scenarios whose marker could not be placed are
    merged into the previous one (outline items joined with " / ", core contents by newline)."""
    alignment = align_markers(document, [(s.head, s.tail) for s in parsed.scenarios], fuzzy_threshold)
    scenarios = []
    for (start, end), group in zip(alignment.spans, alignment.groups, strict=True):
        members = [parsed.scenarios[i] for i in group]
        outline = " / ".join(m.outline for m in members if m.outline)
        core = "\n".join(m.core for m in members if m.core)
        scenarios.append(Scenario(outline=outline, core=core, start=start, end=end))
    return _memory(doc_id, document, scenarios, parsed.reasoning, meta, parse_diagnostics=parsed.diagnostics,
                   alignment=alignment.report)


def grammar_path(document: str, edges: dict[int, list[int]], parsed: ParsedOutput, head_chars: int,
                 tail_chars: int) -> list[tuple[int, int]] | None:
    """The spans of the boundary-graph path whose chunk markers are the parsed ones, or None.

    Guided output was produced along one path of the document's grammar; walking the same graph
    recovers its spans exactly, even where a ``tail+head`` junction repeats in the text (which a
    search-based aligner cannot tell apart). Depth-first, memoised on (scenario, start).
    """
    n, markers = len(document), [(s.head, s.tail) for s in parsed.scenarios]

    def marker(s: int, e: int) -> tuple[str, str]:
        text = document[s:e].strip()
        if len(text) <= head_chars + tail_chars:
            return text.strip(), ""
        return text[:head_chars].strip(), text[-tail_chars:].strip()

    dead: set[tuple[int, int]] = set()

    def walk(i: int, s: int) -> list[tuple[int, int]] | None:
        if i == len(markers):
            return [] if s == n else None
        if s == n or (i, s) in dead:
            return None
        for e in edges.get(s, []):
            if marker(s, e) == markers[i]:
                rest = walk(i + 1, e)
                if rest is not None:
                    return [(s, e), *rest]
        dead.add((i, s))
        return None

    return walk(0, 0)


def memory_from_output(doc_id: str, document: str, output: str, meta: dict[str, Any] | None = None,
                       on_unparseable: str = "raise", fuzzy_threshold: float = 85.0,
                       graph: Any | None = None) -> DocumentMemory:
    """Parse and align one model output.

    ``on_unparseable="whole"`` turns output without any chunk into a one-chunk memory whose
    ``meta["fallback"]`` says so (and a warning is logged); ``"raise"`` re-raises the ParseError.
    ``graph`` (a :class:`memreader.core.memory_grammar.BoundaryGraph` with its settings' ``head_chars``
    and ``tail_chars`` as ``graph.head_chars``/``graph.tail_chars``): guided output is placed along
    the graph path it was generated on; output that is not such a path goes to the aligner.
    """
    if on_unparseable not in ("raise", "whole"):
        raise ValueError(f"on_unparseable must be 'raise' or 'whole', got {on_unparseable!r}")
    try:
        parsed = parse_output(output, document)
    except ParseError as exc:
        if on_unparseable == "raise":
            raise
        log.warning("doc %s: unparseable output, kept the whole document as one chunk (%s)", doc_id, exc)
        scenarios = [Scenario("", "", 0, len(document))] if document else []  # nothing to index but the chunk
        return _memory(doc_id, document, scenarios, None, meta,
                       fallback="unparseable output: whole document kept as one chunk", raw_output_head=output[:500])
    if graph is not None:
        spans = grammar_path(document, graph.edges, parsed, graph.head_chars, graph.tail_chars)
        if spans is not None:
            scenarios = [Scenario(p.outline, p.core, s, e) for p, (s, e) in zip(parsed.scenarios, spans, strict=True)]
            return _memory(doc_id, document, scenarios, parsed.reasoning, meta, parse_diagnostics=parsed.diagnostics,
                           alignment={"markers": len(spans), "chunks": len(spans), "merged": 0,
                                      "methods": {"grammar-path": len(spans)}, "gap_chars": 0, "coverage_exact": 1.0})
        log.warning("doc %s: output is not a path of the document's grammar; aligning it by search", doc_id)
    return memory_from_parsed(doc_id, document, parsed, meta, fuzzy_threshold)
