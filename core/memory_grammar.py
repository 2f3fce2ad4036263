"""A per-document grammar whose every sentence is a valid memory that tiles the document exactly.

    graph = BoundaryGraph.build(document, GrammarSettings())
    lark = memory_grammar(graph, GrammarSettings(), max_new_tokens=512, count_tokens=len)

Details (allowed ends, structural breaks, rule layout, token budget): docs/ARCHITECTURE.md (Guided decoding).
"""

from __future__ import annotations

import bisect
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from memreader.core.config import validate as validate_config
from memreader.core.errors import MemReaderError
from memreader.core.language import is_chinese
from memreader.core.markup import render_chunk_marker


class GuidanceError(MemReaderError, ValueError):
    """A document for which no guided memory can be built with these settings (message: problem — fix)."""


class GrammarBudgetError(GuidanceError):
    """The memory grammar of a text needs more new tokens (``need``) than the budget allows: a shorter text (a
    smaller window) fits."""

    def __init__(self, problem: str, fix: str, need: int, budget: int) -> None:
        super().__init__(problem, fix)
        self.need, self.budget = need, budget


@dataclass(frozen=True)
class GrammarSettings:
    """Shape of a guided memory; character lengths are for English, CJK text divides them."""

    head_chars: int = 12
    tail_chars: int = 12
    min_chunk_chars: int = 150
    max_chunk_chars: int = 1200
    cjk_char_weight: float = 2.5
    max_scenarios: int = 8
    topic_tokens: int = 24
    min_topic_tokens: int = 6
    core_tokens: int = 80
    min_core_tokens: int = 8
    think_tokens: int = 0
    token_safety: float = 1.15

    def problems(self) -> list[str]:
        """Every out-of-range value, with its valid range."""
        out = []
        for name in ("head_chars", "tail_chars", "min_chunk_chars", "max_scenarios", "min_topic_tokens",
                     "min_core_tokens"):
            if getattr(self, name) < 1:
                out.append(f"{name}={getattr(self, name)} must be >= 1")
        if self.max_chunk_chars < self.min_chunk_chars:
            out.append(f"max_chunk_chars={self.max_chunk_chars} must be >= min_chunk_chars={self.min_chunk_chars}")
        if self.topic_tokens < self.min_topic_tokens or self.core_tokens < self.min_core_tokens:
            out.append("topic_tokens/core_tokens must be >= min_topic_tokens/min_core_tokens")
        if self.cjk_char_weight < 1 or self.token_safety < 1 or self.think_tokens < 0:
            out.append("cjk_char_weight and token_safety must be >= 1, think_tokens >= 0")
        return out

    def __post_init__(self) -> None:
        validate_config(self, GuidanceError, "grammar")

    def chunk_range(self, cjk: bool) -> tuple[int, int]:
        """Shortest and longest chunk in characters of a CJK (``cjk``) or other text."""
        weight = self.cjk_char_weight if cjk else 1.0
        low = max(1, round(self.min_chunk_chars / weight))
        return low, max(low, round(self.max_chunk_chars / weight))


# A sentence ends after terminal punctuation (plus closing quotes/brackets) followed by a blank or
# the end; CJK terminal punctuation needs no blank. A paragraph or line ends at a newline.
_SENTENCE_END = re.compile(r"(?:[.!?;…]+[\"'”’)\]]*(?=\s|$)|[。！？；]+[”’」』）)]*|\n)")
_CLAUSE_END = re.compile(r"(?:[,:]+(?=\s)|[，、：]+)")


@dataclass
class BoundaryGraph:
    """Allowed chunk ends from each reachable start; every path from 0 ends at ``len(document)``."""

    document: str
    edges: dict[int, list[int]]
    min_chars: int
    max_chars: int
    relaxed: list[int] = field(default_factory=list)  # starts with no end in range (took the first one past it)
    breaks: list[int] = field(default_factory=list)  # structural breaks no edge crosses (heading / page starts)
    head_chars: int = 12  # marker shape, so a guided reply can be walked back along the graph
    tail_chars: int = 12

    @property
    def starts(self) -> list[int]:
        """Reachable chunk starts, in document order."""
        return sorted(self.edges)

    @property
    def single_chunk(self) -> bool:
        """True when the only memory possible is the whole document as one chunk."""
        return self.edges.get(0) == [len(self.document)]

    def chunk_counts(self) -> dict[int, tuple[int, int]]:
        """(fewest, most) chunks from each start to the document end; ``[0][1]``: the longest path."""
        out = {len(self.document): (0, 0)}
        for s in reversed(self.starts):
            ends = self.edges[s]
            out[s] = (1 + min(out[e][0] for e in ends), 1 + max(out[e][1] for e in ends))
        return out

    @classmethod
    def build(cls, document: str, settings: GrammarSettings, breaks: Sequence[int] = ()) -> BoundaryGraph:
        """Boundaries of ``document`` and the edges between them (see the module docstring); ``breaks`` are
        character offsets where a heading or a page starts."""
        n = len(document)
        if not document.strip():
            raise GuidanceError("the document is empty (or only whitespace): there is nothing to read",
                                "drop empty documents from the corpus")
        min_chars, max_chars = settings.chunk_range(is_chinese(document[:4000]))
        # Longer documents get longer chunks, so that no path has more than max_scenarios chunks.
        min_chars = max(min_chars, math.ceil(n / settings.max_scenarios))
        if min_chars > max_chars:
            raise GuidanceError(
                f"the document has {n} characters: more than max_scenarios x max_chunk_chars "
                f"({settings.max_scenarios} x {max_chars} for its language) fit one guided memory",
                "raise max_scenarios or max_chunk_chars, or split the document into shorter ones")
        sentence = sentence_ends(document)
        clause = sorted(set(_ends(document, _CLAUSE_END)) - set(sentence))
        bounds = sorted({*sentence, *clause})
        # A break is kept where a chunk may end: text before it and at least min_chars after it. It is moved past
        # whitespace, as every chunk end is (a heading map may point at an indented line or a blank before it).
        hard = sorted({b for b in (past_space(document, b) for b in breaks if 0 < b < n)
                       if b < n and document[:b].strip() and n - b >= min_chars})
        # Ends from every position, last first, so that a start knows which later starts lead to a break.
        plan: dict[int, list[int]] = {}
        aims: dict[int, int] = {}  # start -> the break every chunk path from it ends at next
        loose: set[int] = set()  # starts with no end in range
        for s in sorted({0, *bounds, *hard}, reverse=True):
            ends = _in_range(sentence, s, min_chars, max_chars, n) or _in_range(clause, s, min_chars, max_chars, n)
            if n - s <= max_chars:
                ends = sorted({*ends, n})
            if not ends:  # nothing in range: the first boundary past it (or the end) keeps the graph whole
                loose.add(s)
                ends = [next((b for b in bounds if b > s + max_chars), n)]
            # Aim at the first break at least min_chars ahead (a closer one cannot end a chunk from here): end at
            # it, or at an end from which every path ends at it. One that no path reaches is crossed; aim at the next.
            for h in hard[bisect.bisect_left(hard, s + min_chars):]:
                ok = {e for e in ends if e <= h - min_chars and aims.get(e) == h}
                if h - s <= max_chars and h not in loose:  # a chunk can end at h and the next one go on from it
                    ok.add(h)
                if ok:
                    ends, aims[s] = sorted(ok), h
                    break
            if s == 0 and len(ends) > 1:
                ends = [e for e in ends if e < n] or ends  # a memory has at least two chunks when it can
            plan[s] = ends
        edges: dict[int, list[int]] = {}
        todo = [0]
        while todo:
            s = todo.pop()
            if s not in edges:
                edges[s] = plan[s]
                todo.extend(e for e in plan[s] if e < n and e not in edges)
        relaxed = [s for s in edges if s in loose]
        crossed = {b for st, es in edges.items() for e in es for b in hard if st < b < e}
        return cls(document, edges, min_chars, max_chars, sorted(relaxed), breaks=sorted(set(hard) - crossed),
                   head_chars=settings.head_chars, tail_chars=settings.tail_chars)


def _ends(document: str, pattern: re.Pattern[str]) -> list[int]:
    """Chunk ends after each match, moved past following whitespace (the next chunk starts at text), with text
    before them and after them."""
    n, first = len(document), len(document) - len(document.lstrip())
    return sorted({p for m in pattern.finditer(document) if first < (p := past_space(document, m.end())) < n})


def sentence_ends(document: str) -> list[int]:
    """Where a chunk may end after a sentence or paragraph end (past the whitespace that follows)."""
    return _ends(document, _SENTENCE_END)


def past_space(document: str, p: int) -> int:
    """``p`` moved past the whitespace at it (where a chunk that ends before ``p`` ends)."""
    while p < len(document) and document[p].isspace():
        p += 1
    return p


def _in_range(bounds: list[int], s: int, lo: int, hi: int, n: int) -> list[int]:
    """Boundaries ``e`` (sorted) with ``lo <= e - s <= hi`` that leave at least ``lo`` characters after them
    (so the last chunk is not a scrap: a short ending joins the chunk before it)."""
    return [e for e in bounds[bisect.bisect_left(bounds, s + lo):bisect.bisect_right(bounds, s + hi)] if n - e >= lo]


def lark_string(text: str) -> str:
    """A lark string literal for ``text`` (JSON escapes, which llguidance's lark reads)."""
    return json.dumps(text, ensure_ascii=False)


@dataclass
class GrammarPlan:
    """The lark grammar and the limits it was sized with."""

    lark: str
    graph: BoundaryGraph
    scenarios_max: int
    topic_tokens: int
    core_tokens: int
    worst_case_tokens: int
    outline_tied: bool = False  # one outline line per scenario, enforced by the grammar

    @property
    def single_chunk(self) -> bool:
        """The document allows one chunk only (no boundary in range)."""
        return self.graph.single_chunk

    def meta(self) -> dict[str, int | bool]:
        """What a memory records about the grammar that produced it."""
        return {"scenarios_max": self.scenarios_max, "topic_tokens": self.topic_tokens,
                "core_tokens": self.core_tokens, "worst_case_tokens": self.worst_case_tokens,
                "single_chunk": self.single_chunk, "relaxed_starts": len(self.graph.relaxed),
                "outline_tied": self.outline_tied, **({"breaks": len(self.graph.breaks)} if self.graph.breaks else {})}


# Free text never holds "<" (no tag can open), "[" (no [MASK]) or any line break str.splitlines knows.
_NO_FREE = "<\\[\\n\\r\\x0b\\x0c\\x1c-\\x1e\\x85\\u2028\\u2029"
_OPEN = "<scenario>\n<chunk>"
# Above this many (edge x line count) alternatives the outline's line count is left free (the
# count-indexed grammar grows with both); demo-sized documents stay far below it.
_TIED_LIMIT = 6000
_CLOSE_CHUNK = "</chunk>\n"
_CLOSE = "\n</scenario>"


def memory_grammar(graph: BoundaryGraph, settings: GrammarSettings, max_new_tokens: int,
                   count_tokens: Callable[[str], int]) -> GrammarPlan:
    """The lark grammar of every valid memory of ``graph.document``, sized to ``max_new_tokens``.

    ``count_tokens`` gives a string's token count in the generating model's tokenizer; forced text
    is charged ``token_safety`` times that, since a model may spell a literal in more tokens.
    """
    doc, n = graph.document, len(graph.document)
    markers = {(s, e): render_chunk_marker(doc[s:e], settings.head_chars, settings.tail_chars)
               for s, ends in graph.edges.items() for e in ends}
    unique = sorted(set(markers.values()))
    marker_cost = {m: count_tokens(m) for m in unique}

    def forced(tokens: int) -> int:
        return math.ceil(tokens * settings.token_safety)

    per_scenario = forced(count_tokens(_OPEN) + count_tokens(_CLOSE_CHUNK) + count_tokens(_CLOSE + "\n"))
    counts = graph.chunk_counts()
    k_max = counts[0][1]
    fixed = forced(count_tokens("<outline>\n</outline>\n")) + 1  # + the end-of-sequence token
    if settings.think_tokens:
        fixed += settings.think_tokens + forced(count_tokens("<think></think>\n"))

    def worst(core: int, topic: int) -> int:
        best = {n: 0}
        for s in reversed(graph.starts):
            best[s] = max(forced(marker_cost[markers[s, e]]) + per_scenario + core + best[e] for e in graph.edges[s])
        return fixed + k_max * (topic + 1) + best[0]

    topic, core = settings.topic_tokens, settings.core_tokens
    while worst(core, topic) > max_new_tokens and core > settings.min_core_tokens:
        core = max(settings.min_core_tokens, core * 3 // 4)
    while worst(core, topic) > max_new_tokens and topic > settings.min_topic_tokens:
        topic = max(settings.min_topic_tokens, topic * 3 // 4)
    need = worst(core, topic)
    if need > max_new_tokens:
        raise GrammarBudgetError(
            f"a guided memory of this document ({n} characters, up to {k_max} chunks) needs up to {need} new "
            f"tokens even with {core}-token core contents, but max_new_tokens is {max_new_tokens}",
            f"raise max_new_tokens to at least {need}, or raise min_chunk_chars so fewer chunks fit", need,
            max_new_tokens)

    think = "think " if settings.think_tokens else ""
    lines = [
        "%llguidance {}",
        f"topic[max_tokens={topic}]: /[^{_NO_FREE} \\t][^{_NO_FREE}]*/",
        f"core[max_tokens={core}]: /[^{_NO_FREE} \\t][^{_NO_FREE}]*/",
    ]
    if settings.think_tokens:
        lines.append(f"think: {lark_string('<think>')} reasoning {lark_string('</think>' + chr(10))}")
        lines.append(f"reasoning[max_tokens={settings.think_tokens}]: /[^<]+/")

    def scenario(s: int, e: int, nxt: str) -> str:
        body = f"{lark_string(markers[s, e] + _CLOSE_CHUNK)} core {lark_string(_CLOSE)}"
        return body if e == n else f"{body} {lark_string(chr(10))} {nxt}"

    def outline(lines_spec: str) -> str:
        return (f"{lark_string('<outline>' + chr(10))} (topic {lark_string(chr(10))}){lines_spec} "
                f"{lark_string('</outline>' + chr(10))}")

    tied = sum(len(v) for v in graph.edges.values()) * k_max <= _TIED_LIMIT
    if tied:
        lines += _count_tied_rules(graph, counts, think, scenario, outline)
    else:
        lines.append(f"start: {think}outline s0")
        lines.append(f"outline: {outline(f'{{1,{k_max}}}')}")
        for s in graph.starts:
            alts = [scenario(s, e, f"s{e}") for e in graph.edges[s]]
            lines.append(f"s{s}: {lark_string(_OPEN)} ({' | '.join(alts)})")
    return GrammarPlan("\n".join(lines) + "\n", graph, k_max, topic, core, need, tied)


def _count_tied_rules(graph: BoundaryGraph, counts: dict[int, tuple[int, int]], think: str,
                      scenario: Callable[[int, int, str], str], outline: Callable[[str], str]) -> list[str]:
    """One outline line per scenario: the model picks the line count K first, then the scenario rules
    s<start>_<left> only allow paths with exactly K chunks."""
    n = len(graph.document)
    lo, hi = counts[0]
    lines = ["start: " + think + "(" + " | ".join(f"o{k} s0_{k}" for k in range(lo, hi + 1)) + ")"]
    lines += [f"o{k}: {outline(f'{{{k}}}')}" for k in range(lo, hi + 1)]
    todo, seen = [(0, k) for k in range(lo, hi + 1)], set()
    while todo:
        s, left = todo.pop()
        if (s, left) in seen:
            continue
        seen.add((s, left))
        alts = []
        for e in graph.edges[s]:
            if e == n and left == 1:
                alts.append(scenario(s, e, ""))
            elif e < n and counts[e][0] <= left - 1 <= counts[e][1]:
                alts.append(scenario(s, e, f"s{e}_{left - 1}"))
                todo.append((e, left - 1))
        lines.append(f"s{s}_{left}: {lark_string(_OPEN)} ({' | '.join(alts)})")
    return lines
