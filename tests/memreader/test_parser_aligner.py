"""Parser and aligner: hand-written sloppy outputs plus hypothesis properties."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from memreader.core.aligner import align_markers
from memreader.core.assemble import memory_from_output
from memreader.core.markup import escape_markup, render_memory, unescape_markup
from memreader.core.parser import ParseError, parse_output
from memreader.core.schema import tiling_problems

DOC = (
    "Tea came to Europe in the seventeenth century. Dutch traders shipped it first.\n"
    "Brewing needs water just off the boil. Green tea prefers cooler water.\n"
    "Storage matters: keep leaves dry and away from strong smells."
)


def _spans_tile(mem) -> None:
    assert tiling_problems([(s.start, s.end) for s in mem.scenarios], len(mem.document)) == []
    assert "".join(mem.chunks) == mem.document


def test_clean_output_aligns_exactly() -> None:
    cut1 = DOC.index("Brewing")
    cut2 = DOC.index("Storage")
    chunks = [DOC[:cut1], DOC[cut1:cut2], DOC[cut2:]]
    out = render_memory(["History", "Brewing", "Storage"], chunks, ["c1", "c2", "c3"], reasoning="think")
    mem = memory_from_output("d1", DOC, out)
    assert [(s.start, s.end) for s in mem.scenarios] == [(0, cut1), (cut1, cut2), (cut2, len(DOC))]
    assert mem.outline == ["History", "Brewing", "Storage"]
    assert mem.reasoning == "think"
    assert mem.meta["alignment"]["coverage_exact"] == 1.0


def test_sloppy_output_is_repaired_with_diagnostics() -> None:
    out = (
        "Sure! Here is the memory you asked for.\n"
        "<outline>\n1. History\n2. Brewing\n"  # no </outline>, one item short
        "<scenario>\n<chunk>Tea came to[MASK]shipped it first.</chunk>\nHow tea arrived.\n"  # no </scenario>
        "<scenario>\n<chunk>Brewing needs water[MASK]cooler water.\nWater temperature.\n</scenario>\n"
        "<scenario><chunk>Storage matters: keep leaves dry</chunk>Keep it dry.</scenario>\n"  # no [MASK]
        "Hope this helps!"
    )
    mem = memory_from_output("d1", DOC, out)
    _spans_tile(mem)
    diags = " | ".join(mem.meta["parse_diagnostics"])
    assert "missing </outline>" in diags
    assert "missing </chunk>" in diags
    assert "no [MASK]" in diags
    assert "outline has 2 item(s) for 3 scenario(s)" in diags
    assert len(mem.scenarios) == 3
    assert mem.chunks[1].startswith("Brewing") and mem.chunks[2].startswith("Storage")


def test_unplaceable_marker_merges_into_previous_scenario() -> None:
    out = render_memory(["A", "B"], [DOC[:40], DOC[40:]], ["a", "b"]).replace(
        escape_markup(DOC[40:52]), "zzzzzzzzzzzz"
    )
    out = out.replace(escape_markup(DOC[:40][-12:]), "qqqqqqqqqqqq")  # and the tail before it
    mem = memory_from_output("d", DOC, out)
    _spans_tile(mem)
    assert len(mem.scenarios) == 1
    assert mem.scenarios[0].outline == "A / B"
    assert mem.meta["alignment"]["merged"] == 1


def test_fuzzy_fallback_recovers_a_typo() -> None:
    cut = DOC.index("Brewing needs")
    out = render_memory(["A", "B"], [DOC[:cut], DOC[cut:]], ["a", "b"], head_chars=25, tail_chars=25)
    out = out.replace("Brewing needs water just", "Brewing need water jusst")  # typo'd head
    out = out.replace("raders shipped it first.", "raderz shipped it first.")  # and a typo'd tail
    assert "raderz" in out and "jusst" in out
    mem = memory_from_output("d", DOC, out)
    assert mem.scenarios[1].start == cut
    methods = mem.meta["alignment"]["methods"]
    assert sum(v for k, v in methods.items() if k.startswith("fuzzy")) == 1


def test_empty_chunk_and_garbage() -> None:
    out = "<outline>a\nb</outline><scenario><chunk>[MASK]</chunk>x</scenario><scenario><chunk>Tea[MASK]</chunk>y</scenario>"
    mem = memory_from_output("d", DOC, out)
    _spans_tile(mem)
    with pytest.raises(ParseError, match="no <scenario> or <chunk>"):
        parse_output("I cannot help with that.")
    fallback = memory_from_output("d", DOC, "no tags at all", on_unparseable="whole")
    _spans_tile(fallback)
    assert "fallback" in fallback.meta


def test_free_text_mentioning_tags_round_trips() -> None:
    cut = DOC.index("Brewing")
    outline = ["Uses <scenario> and [MASK]", "3.5 million cups"]
    cores = ["The <outline> tag &lt;chunk> here", "Core with </scenario> inside"]
    reasoning = "First I write the <outline> then the <scenario> blocks"
    out = render_memory(outline, [DOC[:cut], DOC[cut:]], cores, reasoning)
    mem = memory_from_output("d", DOC, out)
    assert mem.outline == outline and mem.cores == cores and mem.reasoning == reasoning
    assert [(s.start, s.end) for s in mem.scenarios] == [(0, cut), (cut, len(DOC))]


def test_boundary_with_tail_missing_its_final_period() -> None:
    cut = DOC.index("Brewing")
    out = "<outline>a\nb</outline><scenario><chunk>Tea came to[MASK]traders shipped it first</chunk>x</scenario>"
    out += "<scenario><chunk>Brewing needs[MASK]strong smells.</chunk>y</scenario>"
    mem = memory_from_output("d", DOC, out)
    assert mem.scenarios[1].start == cut  # the "." and newline stay with the first chunk
    assert mem.meta["alignment"]["coverage_exact"] == 1.0


def test_wrong_language_is_reported() -> None:
    out = "<outline>历史</outline><scenario><chunk>Tea came[MASK]smells.</chunk>茶叶的历史与冲泡方法。</scenario>"
    parsed = parse_output(out, DOC)
    assert any("language mismatch" in d for d in parsed.diagnostics)


def test_markup_in_document_survives_round_trip() -> None:
    doc = "Intro with </document> inside.\n<scenario> tag and [MASK] token here.\nEnd part."
    cut = doc.index("<scenario>")
    out = render_memory(["x", "y"], [doc[:cut], doc[cut:]], ["a", "b"], head_chars=15, tail_chars=15)
    assert "[MASK] token" not in out  # the document's own [MASK] was escaped
    mem = memory_from_output("d", doc, out)
    assert [(s.start, s.end) for s in mem.scenarios] == [(0, cut), (cut, len(doc))]
    assert unescape_markup(escape_markup(doc)) == doc


# Alphabet mixes English, Chinese, punctuation, whitespace and the reserved markup pieces.
_pieces = st.sampled_from(list("abcde xyz,.。，的是在了\n") + ["[MASK]", "</document>", "<scenario>", "词语", "word ",
                                                           "&lt;chunk>", "&#91;MASK]", "&amp;", "   ", "\n\n"])
_docs = st.lists(_pieces, min_size=20, max_size=120).map("".join)


def _junctions(doc: str, tail: str, head: str) -> int:
    pat = re.compile(re.escape(tail) + r"\s*" + re.escape(head))
    return sum(1 for i in range(len(doc)) if pat.match(doc, i))


def _marker_parts(chunk: str, k: int) -> tuple[str, str]:
    """(head, tail) as the parser sees them: rendered, then stripped."""
    if len(chunk) <= 2 * k:
        return chunk.strip(), ""
    return chunk[:k].strip(), chunk[-k:].strip()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(doc=_docs, data=st.data(), k=st.integers(min_value=4, max_value=10))
def test_property_true_spans_are_recovered(doc: str, data: st.DataObject, k: int) -> None:
    n = len(doc)
    cuts = sorted(data.draw(st.sets(st.integers(min_value=1, max_value=n - 1), max_size=6)))
    bounds = [0, *cuts, n]
    chunks = [doc[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    assume(all(c.strip() for c in chunks))
    # Recovery is only well defined when each tail+head junction occurs once in the document.
    for i in range(len(chunks) - 1):
        head = _marker_parts(chunks[i + 1], k)[0]
        tail = _marker_parts(chunks[i], k)[1] or chunks[i].strip()
        assume(_junctions(doc, tail, head) == 1)
    out = render_memory([f"t{i}" for i in range(len(chunks))], chunks, ["c"] * len(chunks), None, k, k)
    mem = memory_from_output("d", doc, out)
    # Convention: whitespace at a cut belongs to the earlier chunk (markers are stripped).
    expected = [0] + [c + len(doc[c:]) - len(doc[c:].lstrip()) for c in cuts] + [n]
    assert [(s.start, s.end) for s in mem.scenarios] == list(zip(expected, expected[1:], strict=False))
    assert mem.meta["alignment"]["coverage_exact"] == 1.0 and mem.meta["alignment"]["gap_chars"] == 0


@settings(max_examples=300, deadline=None)
@given(doc=_docs, garbage=st.text(max_size=300), markers=st.lists(st.tuples(st.text(max_size=12), st.text(max_size=12)), max_size=8))
def test_property_garbage_still_tiles(doc: str, garbage: str, markers: list[tuple[str, str]]) -> None:
    mem = memory_from_output("d", doc, garbage, on_unparseable="whole")
    _spans_tile(mem)
    alignment = align_markers(doc, markers)
    assert tiling_problems(alignment.spans, len(doc)) == []
    assert sorted(i for g in alignment.groups for i in g) == list(range(len(markers)))


@settings(max_examples=300, deadline=None)
@given(text=st.lists(_pieces, max_size=40).map("".join))
def test_property_escaping_is_exactly_reversible(text: str) -> None:
    escaped = escape_markup(text)
    assert unescape_markup(escaped) == text
    assert "[MASK]" not in escaped and "<scenario>" not in escaped and "</document>" not in escaped
