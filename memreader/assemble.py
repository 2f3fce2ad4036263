"""From raw model output to a validated :class:`DocumentMemory`: parse, align, merge, check."""

from __future__ import annotations

import logging
from typing import Any

from memreader.aligner import align_markers
from memreader.parser import ParsedOutput, ParseError, parse_output
from memreader.schema import DocumentMemory, Scenario

log = logging.getLogger(__name__)


def memory_from_parsed(
    doc_id: str,
    document: str,
    parsed: ParsedOutput,
    meta: dict[str, Any] | None = None,
    fuzzy_threshold: float = 85.0,
) -> DocumentMemory:
    """Align parsed markers to the document; scenarios whose marker could not be placed are
    merged into the previous one (outline items joined with " / ", core contents by newline)."""
    alignment = align_markers(document, [(s.head, s.tail) for s in parsed.scenarios], fuzzy_threshold)
    scenarios = []
    for (start, end), group in zip(alignment.spans, alignment.groups, strict=True):
        members = [parsed.scenarios[i] for i in group]
        outline = " / ".join(m.outline for m in members if m.outline)
        core = "\n".join(m.core for m in members if m.core)
        scenarios.append(Scenario(outline=outline, core=core, start=start, end=end))
    info = dict(meta or {})
    info["parse_diagnostics"] = parsed.diagnostics
    info["alignment"] = alignment.report
    mem = DocumentMemory(doc_id=doc_id, document=document, scenarios=scenarios, reasoning=parsed.reasoning, meta=info)
    mem.validate()
    return mem


def memory_from_output(
    doc_id: str,
    document: str,
    output: str,
    meta: dict[str, Any] | None = None,
    on_unparseable: str = "raise",
    fuzzy_threshold: float = 85.0,
) -> DocumentMemory:
    """Parse and align one model output.

    ``on_unparseable="whole"`` turns output without any chunk into a one-chunk memory whose
    ``meta["fallback"]`` says so (and a warning is logged); ``"raise"`` re-raises the ParseError.
    """
    if on_unparseable not in ("raise", "whole"):
        raise ValueError(f"on_unparseable must be 'raise' or 'whole', got {on_unparseable!r}")
    try:
        parsed = parse_output(output, document)
    except ParseError as exc:
        if on_unparseable == "raise":
            raise
        log.warning("doc %s: unparseable output, kept the whole document as one chunk (%s)", doc_id, exc)
        info = dict(meta or {})
        info["fallback"] = "unparseable output: whole document kept as one chunk"
        info["raw_output_head"] = output[:500]
        scenarios = [Scenario("", "", 0, len(document))] if document else []  # nothing to index but the chunk
        mem = DocumentMemory(doc_id, document, scenarios, None, info)
        mem.validate()
        return mem
    return memory_from_parsed(doc_id, document, parsed, meta, fuzzy_threshold)
