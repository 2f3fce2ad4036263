"""Long documents: read in windows of the model's tokens, then merged back into one memory.

    plan = plan_windows(texts, count_tokens, WindowSettings(window_tokens=0, overlap_tokens=128), prompt_tokens=...,
                        max_new_tokens=512, model_window=model_window_of(backend), grammar=grammar_settings)
    window_texts = plan.texts(texts)          # plan.errors: documents refused; plan.windows[i]: document i's windows
    memory = merge_window_memories(doc_id, text, plan.windows[i], memories_of_document_i, meta)

Window size, cuts and the merge rule: docs/ARCHITECTURE.md (Long documents).
"""

from __future__ import annotations

import bisect
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from memreader.core.config import field as config_field
from memreader.core.config import validate as validate_config
from memreader.core.errors import MemReaderError
from memreader.core.generation.params import chat_prompt_tokens
from memreader.core.language import is_chinese
from memreader.core.memory_grammar import _CLAUSE_END, _SENTENCE_END, GrammarSettings, _ends
from memreader.core.schema import DocumentMemory, Scenario

CountTokens = Callable[[str], int]

MIN_WINDOW_TOKENS = 32
"""Fewest document tokens a window may hold (below it a long document becomes thousands of calls)."""
MARGIN_TOKENS = 32
"""Kept free in an auto window: a document inside a prompt may tokenise a little longer than alone."""
GRAMMAR_FILL = 0.75
"""Guided windows of a split document hold at most this share of what one memory grammar can take."""


class WindowError(MemReaderError, ValueError):
    """No window fits: the prompt and reply budget fill the model's window, or the sizes disagree."""


@dataclass(frozen=True)
class WindowSettings:
    """How long documents are cut: document tokens per window (0 = auto) and the overlap between windows."""

    window_tokens: int = 0
    overlap_tokens: int = 128

    def problems(self) -> list[str]:
        """Values that can never work, whatever the model."""
        out = []
        if self.window_tokens < 0 or self.overlap_tokens < 0:
            out.append(f"window_tokens={self.window_tokens} and overlap_tokens={self.overlap_tokens} must be >= 0")
        if 0 < self.window_tokens < MIN_WINDOW_TOKENS:
            out.append(f"window_tokens={self.window_tokens} must be 0 (auto) or >= {MIN_WINDOW_TOKENS}")
        if self.window_tokens and self.overlap_tokens * 2 >= self.window_tokens:
            out.append(f"overlap_tokens={self.overlap_tokens} must be under half of window_tokens={self.window_tokens}")
        return out

    def room(self, prompt_tokens: int, max_new_tokens: int, model_window: int | None) -> int | None:
        """Most document tokens one prompt may hold: ``window_tokens`` and what the model's window
        leaves (``model_window`` - prompt - ``max_new_tokens`` - :data:`MARGIN_TOKENS`), whichever
        is smaller; None when neither limits it. A document within it (and within one grammar) is
        read whole."""
        left = None if not model_window else model_window - prompt_tokens - max_new_tokens - MARGIN_TOKENS
        limits = [v for v in (self.window_tokens or None, left) if v is not None]
        return min(limits) if limits else None

    def budget(self, prompt_tokens: int, max_new_tokens: int, model_window: int | None) -> int | None:
        """Document tokens per window of a document that must be split; None when nothing limits it.

        Raises :class:`WindowError` (message: the sizes, and the fix) when the prompt and
        ``max_new_tokens`` leave too little room in the model's window, when an explicit
        ``window_tokens`` would overflow it, or when the overlap takes half the window or more.
        """
        validate_config(self, WindowError, "window")
        left = None if not model_window else model_window - prompt_tokens - max_new_tokens - MARGIN_TOKENS
        sizes = (f"model window {model_window} - prompt {prompt_tokens} - max_new_tokens {max_new_tokens} "
                 f"- margin {MARGIN_TOKENS} = {left} tokens")
        longer = "lower max_new_tokens, or use a model (or max_model_len) with a longer window"
        if left is not None and left < MIN_WINDOW_TOKENS:
            raise WindowError(f"the window is smaller than the prompt: {sizes} are left for the document, "
                              f"and a window needs at least {MIN_WINDOW_TOKENS}", longer)
        if self.window_tokens and left is not None and self.window_tokens > left:
            raise WindowError(f"window_tokens={self.window_tokens} does not fit the model: {sizes} are left for "
                              "the document", f"lower window_tokens to at most {left} (or 0 = auto), or {longer}")
        budget = self.window_tokens or left
        if budget is not None and self.overlap_tokens * 2 >= budget:
            raise WindowError(f"overlap_tokens={self.overlap_tokens} is half or more of a window of {budget} "
                              f"document tokens ({sizes if not self.window_tokens else 'window_tokens'})",
                              f"lower overlap_tokens below {budget // 2}")
        return budget


@dataclass
class WindowConfig:
    """The long-document keys every reading stage config shares (``gen``, ``read``)."""

    window_tokens: int = config_field(0, ge=0, help="long documents: document tokens per window (each window its own "
                                      "prompt and grammar, memories merged into one that tiles the document); 0 = "
                                      "auto: the model's window minus the prompt and max_new_tokens (no limit when "
                                      "unknown, e.g. an HTTP endpoint); guided windows also fit one memory grammar")
    overlap_tokens: int = config_field(128, ge=0, help="long documents: tokens consecutive windows share (the merge "
                                       "cuts inside the overlap); under half a window")

    def windows(self) -> WindowSettings:
        """How long documents are cut into windows."""
        return WindowSettings(self.window_tokens, self.overlap_tokens)


@dataclass(frozen=True)
class Window:
    """One window: the character span ``[start, end)`` of its document."""

    index: int
    start: int
    end: int

    def text(self, document: str) -> str:
        """The window's slice of ``document``."""
        return document[self.start : self.end]


# ---------------------------------------------------------------------------------------------------
# Splitting


_SPACE_RUN = re.compile(r"\s+")


def _tiers(text: str) -> list[list[int]]:
    """Window-end candidates, best first: sentence/paragraph ends, clause ends, blanks."""
    first = len(text) - len(text.lstrip())
    blanks = sorted({m.end() for m in _SPACE_RUN.finditer(text) if first < m.end() < len(text)})
    return [_ends(text, _SENTENCE_END), _ends(text, _CLAUSE_END), blanks]


def _fit_end(text: str, start: int, limit: int, count: CountTokens, tokens: int | None) -> int:
    """Largest ``p`` in ``[start, limit]`` with ``count(text[start:p]) <= tokens`` (a token count
    grows with its text): doubling probes, then bisection, so each probe counts about a window."""
    if tokens is None:
        return limit
    lo, step = start, max(tokens, 16)
    while True:
        p = min(limit, start + step)
        if count(text[start:p]) > tokens:
            hi = p
            break
        lo = p
        if p == limit:
            return limit
        step *= 2
    return _bisect(lo, hi, lambda mid: count(text[start:mid]) <= tokens)[0]


def _bisect(lo: int, hi: int, below: Callable[[int], bool]) -> tuple[int, int]:
    """Narrow ``lo < hi`` (``below(lo)`` true, ``below(hi)`` false) to neighbours ``(lo, lo + 1)``."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if below(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


def _pick(candidates: list[int], lo: int, hi: int, want: str) -> int | None:
    """The largest (``want="last"``) or smallest (``"first"``) candidate in ``[lo, hi]``."""
    if want == "last":
        i = bisect.bisect_right(candidates, hi) - 1
        return candidates[i] if i >= 0 and candidates[i] >= lo else None
    i = bisect.bisect_left(candidates, lo)
    return candidates[i] if i < len(candidates) and candidates[i] <= hi else None


def split_windows(text: str, count_tokens: CountTokens, window_tokens: int | None, overlap_tokens: int = 0,
                  max_chars: int | None = None) -> list[Window]:
    """Windows covering ``text``: each at most ``window_tokens`` tokens (None: no token limit) and
    ``max_chars`` characters (None: no limit), consecutive ones sharing at most ``overlap_tokens``
    tokens, ends at sentence/paragraph boundaries where possible (see the module docstring).

    A text within both limits is one window ``[0, len)``. Counting is about ``log2(window)`` probes
    of one window's text per window, so a 100,000-character document costs a few dozen window counts.
    """
    n = len(text)
    cap = n if max_chars is None else max(1, max_chars)
    if window_tokens is not None and window_tokens < 1:
        raise WindowError(f"window_tokens={window_tokens} holds no text", "give a window of at least 1 token")
    if n <= cap and (window_tokens is None or count_tokens(text) <= window_tokens):
        return [Window(0, 0, n)]
    tiers = _tiers(text)
    windows: list[Window] = []
    start, before = 0, 0  # before: end of the window before the previous one (overlaps stay disjoint)
    while True:
        last = windows[-1].end if windows else 0
        fit = _fit_end(text, start, min(n, start + cap), count_tokens, window_tokens)
        if fit <= last:
            raise WindowError(f"a window of {window_tokens} tokens cannot reach past character {last} "
                              f"({text[last:last + 1]!r}) from {start}", "raise window_tokens or lower overlap_tokens")
        end = fit
        if fit < n:
            floor = max(start + (fit - start + 1) // 2, last + 1)
            end = next((b for tier in tiers if (b := _pick(tier, floor, fit, "last")) is not None), fit)
            if window_tokens is not None and end < fit and count_tokens(text[start:end]) > window_tokens:
                end = fit  # a shorter text that tokenises longer: keep the measured end
        windows.append(Window(len(windows), start, end))
        if end >= n:
            return windows
        nxt = end
        if overlap_tokens:
            lowest = max(start + 1, before, end - cap // 2)  # the next window must reach past `end`
            if lowest < end:
                q = _first_fit_start(text, lowest, end, count_tokens, overlap_tokens)
                # a sentence start anywhere in the overlap (a window should not open mid-sentence), else
                # a clause start or a blank in its first half, else any character
                reach = [end - 1, q + (end - q) // 2, q + (end - q) // 2]
                nxt = next((b for tier, hi in zip(tiers, reach, strict=True)
                            if (b := _pick(tier, q, hi, "first")) is not None), q)
        before, start = end, nxt


def _first_fit_start(text: str, lowest: int, end: int, count: CountTokens, tokens: int) -> int:
    """Smallest ``q`` in ``[lowest, end]`` with ``count(text[q:end]) <= tokens``."""
    if count(text[lowest:end]) <= tokens:
        return lowest
    # count(text[lowest:end]) > tokens >= count(text[end:end])
    return _bisect(lowest, end, lambda mid: count(text[mid:end]) > tokens)[1]


# ---------------------------------------------------------------------------------------------------
# Planning for a stage


def grammar_chars(text: str, grammar: GrammarSettings, conservative: bool = False) -> int:
    """Most characters one memory grammar takes for ``text`` (``max_scenarios`` x the longest chunk,
    as :meth:`memreader.core.memory_grammar.BoundaryGraph.build` sizes it). ``conservative``: the CJK
    weight applies if any stretch of the text is CJK, since a window's grammar weighs its own text."""
    if conservative:
        cjk = any(is_chinese(text[i : i + 4000]) for i in range(0, max(len(text) - 2000, 1), 2000))
    else:
        cjk = is_chinese(text[:4000])
    return grammar.max_scenarios * grammar.chunk_range(cjk)[1]


@dataclass
class WindowPlan:
    """The windows of each document of a batch, and the flat order in which a stage asks for them.

    A document in ``errors`` (index → message: problem — fix) has no windows: refuse it before any
    model call, as for a document without a grammar.
    """

    windows: list[list[Window]]
    budget: int | None = None  # document tokens per window of a split document (None: no token limit)
    errors: dict[int, str] = field(default_factory=dict)

    def flat(self) -> list[tuple[int, Window]]:
        """``(document index, window)`` for every window of every document, documents in order."""
        return [(d, w) for d, ws in enumerate(self.windows) for w in ws]

    def texts(self, documents: Sequence[str]) -> list[str]:
        """The window texts in :meth:`flat` order."""
        return [w.text(documents[d]) for d, w in self.flat()]


def plan_windows(texts: Sequence[str], count_tokens: CountTokens, settings: WindowSettings, *,
                 prompt_tokens: int = 0, max_new_tokens: int = 0, model_window: int | None = None,
                 grammar: GrammarSettings | None = None, scale: dict[int, float] | None = None) -> WindowPlan:
    """Windows for each text, sized as the module docstring says (``grammar``: guided); a text that cannot be split
    gets no windows and its message in ``errors``. ``prompt_tokens``: the prompt around an empty document
    (:func:`prompt_tokens_of`); ``model_window``: :func:`model_window_of` (None: unknown); ``scale``: text index →
    factor on the grammar's capacity (:func:`memreader.core.guidance.plan_guided_windows` sets it)."""
    room = settings.room(prompt_tokens, max_new_tokens, model_window)
    budget, budget_error = None, None
    try:
        budget = settings.budget(prompt_tokens, max_new_tokens, model_window)
    except WindowError as exc:
        budget_error = str(exc)
    plan = WindowPlan([], budget)
    for i, text in enumerate(texts):
        factor = (scale or {}).get(i, 1.0)
        fits_grammar = grammar is None or len(text) <= grammar_chars(text, grammar) * factor
        if fits_grammar and (room is None or count_tokens(text) <= room):
            plan.windows.append([Window(0, 0, len(text))])
            continue
        cap = None
        if grammar is not None:
            cap = max(1, math.floor(GRAMMAR_FILL * factor * grammar_chars(text, grammar, conservative=True)))
        try:
            if budget_error:
                raise WindowError(budget_error)
            plan.windows.append(split_windows(text, count_tokens, budget, settings.overlap_tokens, cap))
        except WindowError as exc:
            plan.windows.append([])
            plan.errors[i] = f"the document needs windows ({len(text)} characters), but {exc}"
    return plan


def model_window_of(backend: Any) -> int | None:
    """The context length of a backend's model when it can tell (its ``model_window()``, as
    :class:`~memreader.core.generation.LocalChat` has); None otherwise (an HTTP endpoint)."""
    ask = getattr(backend, "model_window", None)
    return ask() if callable(ask) else None


def prompt_tokens_of(messages: list[dict[str, str]], backend: Any, count_tokens: CountTokens) -> int:
    """Tokens of ``messages`` (rendered around an empty document) as the model sees them: through
    the backend tokenizer's chat template when it has one, else counted with 8 tokens per message."""
    get = getattr(backend, "tokenizer", None)
    tok = get() if callable(get) else None
    if tok is not None and hasattr(tok, "apply_chat_template"):
        return chat_prompt_tokens(tok, messages)
    return sum(count_tokens(m["content"]) + 8 for m in messages) + 8


# ---------------------------------------------------------------------------------------------------
# Merging


def check_windows(windows: Sequence[Window], length: int) -> None:
    """Raise ValueError unless the windows cover ``[0, length)`` in order with disjoint overlaps."""
    problems = []
    if not windows:
        problems.append("no windows")
    else:
        if windows[0].start != 0 or windows[-1].end != length:
            problems.append(f"windows span [{windows[0].start}, {windows[-1].end}), the document [0, {length})")
        for k, w in enumerate(windows):
            if w.index != k or w.end <= w.start:
                problems.append(f"window {k} is {w}")
            if k and not windows[k - 1].start < w.start <= windows[k - 1].end < w.end:
                problems.append(f"window {k} {w} does not overlap or follow window {k - 1} {windows[k - 1]}")
            if k > 1 and w.start < windows[k - 2].end:
                problems.append(f"window {k} starts before window {k - 2} ends")
    if problems:
        raise ValueError("bad windows: " + "; ".join(problems))


def _cut(prev: list[tuple[int, int]], nxt: list[tuple[int, int]], lo: int, hi: int) -> int:
    """The cut in the overlap ``[lo, hi]`` of two windows' global spans (see the merge rule)."""
    ends = [e for _, e in prev if lo <= e <= hi]  # holds hi: the earlier window's last chunk ends there
    agreed = [e for e in ends if e in {s for s, _ in nxt}]
    middle = (lo + hi) / 2
    return min(agreed or ends, key=lambda e: (abs(e - middle), e))


def merge_window_memories(doc_id: str, document: str, windows: Sequence[Window],
                          memories: Sequence[DocumentMemory], meta: dict[str, Any] | None = None) -> DocumentMemory:
    """One memory tiling ``document`` from one memory per window (each tiling its window's text),
    by the merge rule of the module docstring; ``meta`` (the caller's) gets ``windows``, and the
    windows' ``generation``, ``truncated``, ``fallback``, ``parse_diagnostics`` and ``alignment``
    aggregated. The result is validated."""
    check_windows(windows, len(document))
    if len(memories) != len(windows):
        raise ValueError(f"{len(memories)} memories for {len(windows)} windows of {doc_id!r}")
    spans = []
    for w, mem in zip(windows, memories, strict=True):
        if mem.document != w.text(document):
            raise ValueError(f"the memory for window {w.index} of {doc_id!r} is not of that window's text")
        mem.validate()
        spans.append([(s.start + w.start, s.end + w.start) for s in mem.scenarios])
    cuts = [0] + [_cut(spans[k], spans[k + 1], windows[k + 1].start, windows[k].end)
                  for k in range(len(windows) - 1)] + [len(document)]
    scenarios: list[Scenario] = []
    info = []
    for k, (w, mem) in enumerate(zip(windows, memories, strict=True)):
        lo, hi = cuts[k], cuts[k + 1]
        kept, clipped = 0, 0
        for sc, (s, e) in zip(mem.scenarios, spans[k], strict=True):
            if e <= lo or s >= hi:
                continue
            clipped += max(0, lo - s) + max(0, e - hi)
            scenarios.append(Scenario(sc.outline, sc.core, max(s, lo), min(e, hi)))
            kept += 1
        entry: dict[str, Any] = {"index": w.index, "start": w.start, "end": w.end, "kept": [lo, hi],
                                 "scenarios": len(mem.scenarios), "kept_scenarios": kept, "clipped_chars": clipped}
        for key in ("generation", "truncated", "fallback"):
            if key in mem.meta:
                entry[key] = mem.meta[key]
        info.append(entry)
    out = {**(meta or {}), **_aggregate(windows, memories, cuts, len(document)), "windows": info}
    reasoning = "\n\n".join(m.reasoning for m in memories if m.reasoning) or None
    merged = DocumentMemory(doc_id, document, scenarios, reasoning, out)
    merged.validate()
    return merged


def _aggregate(windows: Sequence[Window], memories: Sequence[DocumentMemory], cuts: list[int],
               length: int) -> dict[str, Any]:
    """The windows' generation and alignment facts, summed up for the merged memory's meta."""
    out: dict[str, Any] = {}
    gens = [m.meta.get("generation") or {} for m in memories]
    if any(gens):
        fates = [g.get("fate") for g in gens]
        reasons = [g.get("finish_reason") for g in gens]
        out["generation"] = {
            "guided": all(g.get("guided") for g in gens),
            "finish_reason": "length" if "length" in reasons else (reasons[0] if len(set(reasons)) == 1 else None),
            "fate": next((f for f in ("truncated-kept", "retried") if f in fates), fates[0] if len(set(fates)) == 1
                         else None),
            "prompt_tokens": sum(g.get("prompt_tokens") or 0 for g in gens),
            "completion_tokens": sum(g.get("completion_tokens") or 0 for g in gens),
            "windows": len(windows),
        }
    if any(m.meta.get("truncated") for m in memories):
        out["truncated"] = True
    fallbacks = [f"window {w.index}: {m.meta['fallback']}" for w, m in zip(windows, memories, strict=True)
                 if "fallback" in m.meta]
    if fallbacks:
        out["fallback"] = "; ".join(fallbacks)
    if any("parse_diagnostics" in m.meta for m in memories):
        out["parse_diagnostics"] = [f"window {w.index}: {d}" for w, m in zip(windows, memories, strict=True)
                                    for d in m.meta.get("parse_diagnostics") or []]
    reports = [m.meta.get("alignment") or {} for m in memories]
    if any(reports):
        methods: Counter[str] = Counter()
        for r in reports:
            methods.update(r.get("methods") or {})
        kept = [cuts[k + 1] - cuts[k] for k in range(len(windows))]
        out["alignment"] = {
            "markers": sum(r.get("markers", 0) for r in reports), "merged": sum(r.get("merged", 0) for r in reports),
            "methods": dict(methods), "gap_chars": sum(r.get("gap_chars", 0) for r in reports),
            # each window's exact share, weighted by the characters it kept
            "coverage_exact": round(sum(r.get("coverage_exact", 0.0) * c for r, c in zip(reports, kept, strict=True))
                                    / length, 6) if length else 1.0,
        }
    return out
