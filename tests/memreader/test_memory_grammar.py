"""Guided memory grammars: the boundary graph, what the lark grammar accepts (real llguidance and the
embedded SmolLM2 tokenizer), hypothesis round trips through the parser and aligner, token budgets."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from memreader.core.assemble import memory_from_output
from memreader.core.generation.guided import compile_matcher
from memreader.core.markup import render_memory
from memreader.core.memory_grammar import BoundaryGraph, GrammarSettings, GuidanceError, memory_grammar

SMALL = GrammarSettings(min_chunk_chars=20, max_chunk_chars=80, topic_tokens=8, min_topic_tokens=3,
                        core_tokens=12, min_core_tokens=4)
DOC = ("The cat sat on a mat today. It was warm and the sun was out! Birds sang in the old oak tree? "
       "Then rain came down hard.\nEveryone ran inside quickly. The price rose to 3.5 dollars at noon. "
       "The end of the story is here.")


@pytest.fixture(scope="module")
def hf_tok(smollm2_path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="module")
def ll_tok(hf_tok):
    from memreader.core.generation.guided import ll_tokenizer

    return ll_tokenizer(hf_tok)


def accepts(ll_tok, grammar: str, text: str) -> bool:
    """True when ``text`` (then end-of-sequence) is a complete sentence of ``grammar``."""
    matcher = compile_matcher(ll_tok, grammar)
    return matcher.consume_tokens(ll_tok.tokenize_str(text)) and matcher.is_accepting()


def _count(hf_tok):
    return lambda text: len(hf_tok.encode(text, add_special_tokens=False))


def _check_graph(graph: BoundaryGraph) -> None:
    """Edges point forward, every target is a state or the end, and the end is reachable from each state."""
    n = len(graph.document)
    for s, ends in graph.edges.items():
        assert ends and ends == sorted(set(ends)), (s, ends)
        for e in ends:
            assert s < e <= n
            assert e == n or e in graph.edges, f"end {e} of state {s} has no edges"
    reach = {n}
    for s in reversed(graph.starts):
        assert any(e in reach for e in graph.edges[s])
        reach.add(s)
    assert 0 in graph.edges


def _first_path(graph: BoundaryGraph, pick: int = 0) -> list[int]:
    path = [0]
    while path[-1] < len(graph.document):
        ends = graph.edges[path[-1]]
        path.append(ends[min(pick, len(ends) - 1)])
    return path


def _render(doc: str, path: list[int], s: GrammarSettings, topic: str = "topic words", core: str = "core words"):
    chunks = [doc[a:b] for a, b in zip(path, path[1:], strict=False)]
    return render_memory([f"{topic} {i}" for i in range(len(chunks))], chunks,
                         [f"{core} {i}" for i in range(len(chunks))], head_chars=s.head_chars, tail_chars=s.tail_chars)


def test_graph_boundaries_follow_sentences_and_chunk_sizes() -> None:
    graph = BoundaryGraph.build(DOC, SMALL)
    _check_graph(graph)
    n = len(DOC)
    sentence_ends = {m.end() for m in re.finditer(r"[.!?](?:\s+)", DOC)} | {DOC.index("Everyone")}
    decimal = DOC.index("3.5") + 2
    assert graph.min_chars == max(20, -(-n // 8)) and graph.max_chars == 80 and graph.relaxed == []
    for s, ends in graph.edges.items():
        assert s == 0 or s in sentence_ends
        for e in ends:
            assert e != decimal
            if e < n:
                assert e in sentence_ends, (s, e)
                assert graph.min_chars <= e - s <= 80, (s, e)
            else:
                assert e - s <= 80
    assert len(graph.edges) >= 5 and graph.chunk_counts()[0][1] >= 5 and not graph.single_chunk


def test_headings_and_page_breaks_are_not_crossed_when_the_range_allows() -> None:
    doc = ("Garden club notes. We meet weekly in the hall. Tea is served after.\n"
           "Compost\nThree bays sit behind the greenhouse. Turn them monthly. Keep them damp.\n"
           "Trips\nThe spring trip goes to the botanic garden. Bring lunch and boots.")
    settings = GrammarSettings(min_chunk_chars=20, max_chunk_chars=120, max_scenarios=8)
    heading, trips = doc.index("Compost"), doc.index("Trips")
    free = BoundaryGraph.build(doc, settings)
    assert any(s < heading < e for s, ends in free.edges.items() for e in ends)  # without breaks a chunk may cross
    graph = BoundaryGraph.build(doc, settings, breaks=[heading, trips])
    _check_graph(graph)
    assert graph.breaks == [heading, trips]
    for s, ends in graph.edges.items():
        for e in ends:  # crossing only where the break is too close to the start for a chunk to end there
            assert not any(s < b < e and b - s >= graph.min_chars for b in (heading, trips)), (s, e)
    assert heading in graph.edges[0] and heading in graph.edges  # the break is itself an end, then a start
    # a break that the range cannot reach from a start (too close to it) is not forced
    near = BoundaryGraph.build(doc, settings, breaks=[5])
    assert near.breaks == [] and near.edges == free.edges


def test_a_break_with_no_way_on_is_not_forced() -> None:
    # ends at 250 and 540 only: a chunk ending at the break (200) could not go on within 100..300 characters
    doc = "a" * 249 + "." + " " + "b" * 288 + "." + " " + "c" * 259
    settings = GrammarSettings(min_chunk_chars=100, max_chunk_chars=300, max_scenarios=8)
    free = BoundaryGraph.build(doc, settings)
    graph = BoundaryGraph.build(doc, settings, breaks=[200])
    assert graph.edges == free.edges and graph.relaxed == free.relaxed == [] and graph.breaks == []


def test_a_break_too_close_to_the_start_does_not_free_the_later_ones() -> None:
    # a title, the first section heading right under it (too close to end a chunk), then sections of ~200 characters:
    # the close break used to be "the next break" of start 0, and chunks from 0 then crossed every later heading too
    body = "Plants need water. Roots take it up from the soil. Leaves lose it to the air on warm days. " * 2
    doc = "Garden notes\n\n" + "".join(f"Part {i}\n\n{body}\n\n" for i in range(1, 5)).rstrip()
    parts = [doc.index(f"Part {i}") for i in range(1, 5)]
    settings = GrammarSettings(min_chunk_chars=100, max_chunk_chars=400, max_scenarios=8)
    graph = BoundaryGraph.build(doc, settings, breaks=parts)
    _check_graph(graph)
    assert parts[0] < graph.min_chars and graph.breaks == parts[1:]
    # a heading map that points at the blank line before a heading (or an indented one) is the same break
    assert BoundaryGraph.build(doc, settings, breaks=[p - 2 for p in parts]).breaks == parts[1:]


def test_state_zero_drops_the_whole_document_edge() -> None:
    doc = "Short first sentence here. A second one follows now. And a third closes it."
    graph = BoundaryGraph.build(doc, GrammarSettings(min_chunk_chars=10, max_chunk_chars=200))
    _check_graph(graph)
    assert len(doc) not in graph.edges[0] and graph.edges[0]
    assert any(len(doc) in ends for ends in graph.edges.values())
    assert not graph.single_chunk and graph.chunk_counts()[0][1] >= 2


@pytest.mark.parametrize("doc", ["one long run of words with no stop at all " * 2,
                                 "a long stretch without any sentence end " * 40])
def test_document_without_boundary_is_a_single_chunk(doc: str) -> None:
    graph = BoundaryGraph.build(doc, GrammarSettings(min_chunk_chars=20, max_chunk_chars=400))
    assert graph.single_chunk and graph.edges == {0: [len(doc)]} and graph.chunk_counts()[0][1] == 1


@pytest.mark.parametrize("doc", ["", "   \n\t "])
def test_empty_document_is_refused_with_a_fix(doc: str) -> None:
    with pytest.raises(GuidanceError, match="empty") as info:
        BoundaryGraph.build(doc, SMALL)
    assert "fix:" in str(info.value)


def test_too_long_document_names_max_scenarios() -> None:
    doc = "Word soup sentence here. " * 40  # 1000 chars > 8 x 80
    with pytest.raises(GuidanceError, match="max_scenarios"):
        BoundaryGraph.build(doc, SMALL)
    BoundaryGraph.build(doc, GrammarSettings(min_chunk_chars=20, max_chunk_chars=80, max_scenarios=13))


def test_cjk_documents_get_shorter_chunks() -> None:
    sentence = "今天天气很好我们一起去公园散步看花。"  # 18 characters
    doc = sentence * 8
    s = GrammarSettings(min_chunk_chars=50, max_chunk_chars=200)
    graph = BoundaryGraph.build(doc, s)
    _check_graph(graph)
    assert (graph.min_chars, graph.max_chars) == (20, 80)
    for start, ends in graph.edges.items():
        assert start % 18 == 0
        for e in ends:
            assert e % 18 == 0 and e - start <= 80
            assert e == len(doc) or e - start >= 20
    english = BoundaryGraph.build("Plain words go here. " * 8, s)
    assert english.max_chars == 200


@pytest.mark.integration
def test_grammar_accepts_a_true_memory_and_rejects_broken_ones(hf_tok, ll_tok) -> None:
    graph = BoundaryGraph.build(DOC, SMALL)
    plan = memory_grammar(graph, SMALL, 4000, _count(hf_tok))
    path = _first_path(graph)
    assert len(path) >= 5
    good = _render(DOC, path, SMALL)
    assert accepts(ll_tok, plan.lark, good)
    assert accepts(ll_tok, plan.lark, _render(DOC, _first_path(graph, 1), SMALL))
    chunks = [DOC[a:b] for a, b in zip(path, path[1:], strict=False)]
    skipped = [chunks[0], *chunks[2:]]  # the second chunk starts past the end of the first
    out = render_memory(["t"] * len(skipped), skipped, ["c"] * len(skipped), head_chars=12, tail_chars=12)
    assert not accepts(ll_tok, plan.lark, out)
    swapped = [chunks[0], chunks[2], chunks[1], *chunks[3:]]
    out = render_memory(["t"] * len(chunks), swapped, ["c"] * len(chunks), head_chars=12, tail_chars=12)
    assert not accepts(ll_tok, plan.lark, out)
    head = chunks[1][:12]
    assert not accepts(ll_tok, plan.lark, good.replace(head, head.upper(), 1))  # invented head
    tail = chunks[1].strip()[-12:]
    assert not accepts(ll_tok, plan.lark, good.replace(tail + "</chunk>", tail[:-2] + "!!</chunk>", 1))
    assert not accepts(ll_tok, plan.lark, good[:-1])  # a memory cut short is no sentence
    assert not accepts(ll_tok, plan.lark, good.replace("core words 1", "core [x] 1"))


@pytest.mark.integration
def test_budget_shrinks_cores_then_refuses(hf_tok) -> None:
    graph = BoundaryGraph.build(DOC, SMALL)
    full = memory_grammar(graph, SMALL, 100_000, _count(hf_tok))
    assert full.core_tokens == SMALL.core_tokens and full.topic_tokens == SMALL.topic_tokens
    assert full.worst_case_tokens <= 100_000 and full.scenarios_max == graph.chunk_counts()[0][1]
    tight = memory_grammar(graph, SMALL, full.worst_case_tokens - 1, _count(hf_tok))
    assert tight.worst_case_tokens <= full.worst_case_tokens - 1
    assert SMALL.min_core_tokens <= tight.core_tokens < SMALL.core_tokens
    with pytest.raises(GuidanceError, match="max_new_tokens") as info:
        memory_grammar(graph, SMALL, 50, _count(hf_tok))
    assert "raise max_new_tokens to at least" in str(info.value)


# Random documents: English and Chinese sentences, odd punctuation, newlines, reserved markup.
_WORDS = ["alpha", "beta", "gamma", "delta", "omega", "river", "stone", "tree", "<chunk>", "[MASK]",
          "</scenario>", "&lt;chunk>", "&#91;MASK]", "3.5", "x<y", "a[b]", "Zoë", "don't"]
_HAN = list("天地人山水火木金土日月风云雨雪花草")
_english = st.tuples(st.lists(st.sampled_from(_WORDS), min_size=1, max_size=7).map(" ".join),
                     st.sampled_from([".", "!", "?", ";", ",", ""]),
                     st.sampled_from([" ", " ", "\n", "\n\n", "  "])).map("".join)
_chinese = st.tuples(st.lists(st.sampled_from(_HAN), min_size=2, max_size=12).map("".join),
                     st.sampled_from(["。", "！", "，"]), st.sampled_from(["", "", "\n"])).map("".join)
_docs = st.tuples(st.sampled_from(["", "\n"]), st.lists(st.one_of(_english, _chinese), min_size=1, max_size=14)
                  .map("".join)).map("".join)
PROP = GrammarSettings(min_chunk_chars=20, max_chunk_chars=100, topic_tokens=8, min_topic_tokens=3,
                       core_tokens=12, min_core_tokens=4)


def _junctions_unique(doc: str, path: list[int], k: int) -> bool:
    """Whether each ``tail\\s*head`` junction of the path occurs once in ``doc``: the aligner places a
    boundary at the first junction past the previous head, so a repeated one is ambiguous to it."""
    chunks = [doc[a:b].strip() for a, b in zip(path, path[1:], strict=False)]
    for prev, nxt in zip(chunks, chunks[1:], strict=False):
        if len(prev) > 2 * k:
            head = nxt if len(nxt) <= 2 * k else nxt[:k].strip()
            pat = re.compile(re.escape(prev[-k:].strip()) + r"\s*" + re.escape(head))
            if sum(1 for i in range(len(doc)) if pat.match(doc, i)) != 1:
                return False
    return True


@pytest.mark.integration
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(doc=_docs, data=st.data())
def test_property_any_graph_path_is_accepted_and_aligns_exactly(hf_tok, ll_tok, doc: str, data) -> None:
    assume(doc.strip())
    try:
        graph = BoundaryGraph.build(doc, PROP)
    except GuidanceError as err:
        # a document longer than max_scenarios x max_chunk_chars is refused by design (test above): not a graph to
        # walk; any other refusal is a failure
        assume("max_scenarios" not in str(err))
        raise
    _check_graph(graph)
    path = [0]
    while path[-1] < len(doc):
        path.append(data.draw(st.sampled_from(graph.edges[path[-1]])))
    plan = memory_grammar(graph, PROP, 100_000, _count(hf_tok))
    out = _render(doc, path, PROP, topic="t", core="c")
    assert accepts(ll_tok, plan.lark, out), out
    spans = list(zip(path, path[1:], strict=False))
    mem = memory_from_output("d", doc, out, graph=graph)  # the guided path: walk the graph
    assert [(s.start, s.end) for s in mem.scenarios] == spans
    assert mem.meta["alignment"]["coverage_exact"] == 1.0
    if _junctions_unique(doc, path, PROP.head_chars):  # search alone is exact too when junctions are unique
        plain = memory_from_output("d", doc, out)
        assert [(s.start, s.end) for s in plain.scenarios] == spans
        assert plain.meta["alignment"]["coverage_exact"] == 1.0


@pytest.mark.integration
def test_repeated_junction_in_guided_output_aligns_to_the_grammar_path(hf_tok, ll_tok) -> None:
    """Search alone takes the first tail+head junction (here the wrong one, and it cannot tell: it
    reports an exact tiling); the graph walk recovers the path the grammar generated."""
    tiny = GrammarSettings(min_chunk_chars=8, max_chunk_chars=60, head_chars=4, tail_chars=4, topic_tokens=8,
                           min_topic_tokens=3, core_tokens=12, min_core_tokens=4)
    doc = "ef. ef. ab. ab. ab ab ab ef. ab. ab ab ab ef.."
    graph = BoundaryGraph.build(doc, tiny)
    assert graph.edges[0] == [8, 12, 16, 29, 33] and graph.edges[8] == [16, 29, 33, 46] and graph.edges[33] == [46]
    path = [(0, 8), (8, 33), (33, 46)]
    out = render_memory(["t0", "t1", "t2"], [doc[a:b] for a, b in path], ["c0", "c1", "c2"], None, 4, 4)
    assert accepts(ll_tok, memory_grammar(graph, tiny, 100_000, _count(hf_tok)).lark, out)
    searched = memory_from_output("d", doc, out)
    assert [(s.start, s.end) for s in searched.scenarios] != path  # search is fooled (and cannot tell)
    mem = memory_from_output("d", doc, out, graph=graph)
    assert [(s.start, s.end) for s in mem.scenarios] == path
    assert mem.meta["alignment"]["coverage_exact"] == 1.0 and mem.meta["alignment"]["methods"] == {"grammar-path": 3}


@pytest.mark.integration
@pytest.mark.parametrize("brk", ["\u2028", "\r", "\x0b", "\x85"])
def test_free_text_cannot_hold_a_line_break(hf_tok, ll_tok, brk: str) -> None:
    """The parser splits the outline with str.splitlines: no line break of any kind may enter a topic."""
    doc = "The cat sat on a mat today. It was warm and the sun was out! Birds sang in the old oak tree?"
    graph = BoundaryGraph.build(doc, SMALL)
    path = [0]
    while path[-1] < len(doc):
        path.append(graph.edges[path[-1]][0])
    lark = memory_grammar(graph, SMALL, 100_000, _count(hf_tok)).lark
    out = _render(doc, path, SMALL)
    assert accepts(ll_tok, lark, out)
    assert not accepts(ll_tok, lark, out.replace("topic words 0", f"topic{brk}words 0"))
    assert not accepts(ll_tok, lark, out.replace("core words 0", f"core{brk}words 0"))
    assert render_memory([f"a{brk}b"], [doc], ["c"]).count("\n") == render_memory(["a b"], [doc], ["c"]).count("\n")


@pytest.mark.integration
def test_outline_line_count_is_tied_to_the_scenarios(hf_tok, ll_tok) -> None:
    """Small graphs: exactly one outline line per scenario, so the parser pairs them without repair."""
    doc = "The cat sat on a mat today. It was warm and the sun was out! Birds sang in the old oak tree?"
    graph = BoundaryGraph.build(doc, SMALL)
    plan = memory_grammar(graph, SMALL, 100_000, _count(hf_tok))
    assert plan.outline_tied and plan.meta()["outline_tied"]
    path = [0]
    while path[-1] < len(doc):
        path.append(graph.edges[path[-1]][0])
    chunks = [doc[a:b] for a, b in zip(path, path[1:], strict=False)]
    good = render_memory([f"topic {i}" for i in range(len(chunks))], chunks, ["core"] * len(chunks))
    assert accepts(ll_tok, plan.lark, good)
    one_more = render_memory([f"topic {i}" for i in range(len(chunks) + 1)], chunks + [""], ["core"] * (len(chunks) + 1))
    assert not accepts(ll_tok, plan.lark, one_more.rsplit("<scenario>", 1)[0].rstrip("\n"))  # extra outline line
    one_less = good.replace("topic 0\n", "", 1)
    assert not accepts(ll_tok, plan.lark, one_less)
    parsed = memory_from_output("d", doc, good, graph=graph)
    assert not parsed.meta["parse_diagnostics"] and parsed.outline == [f"topic {i}" for i in range(len(chunks))]


@pytest.mark.integration
def test_large_graphs_leave_the_outline_count_free(hf_tok) -> None:
    big = GrammarSettings(max_scenarios=64)
    doc = " ".join(f"Sentence number {i} talks about item {i % 7} in some detail here." for i in range(400))
    plan = memory_grammar(BoundaryGraph.build(doc, big), big, 100_000, _count(hf_tok))
    assert not plan.outline_tied and "outline: " in plan.lark
