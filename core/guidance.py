"""Guided memory generation for the stages: grammars per document, and the truncation policy.

    grammars = MemoryGrammars(settings, count_tokens_for(backend))
    plans, errors = grammars.plan([doc.text for doc in docs], max_new_tokens)
    reply, fate = settle_reply(reply, on_truncated="retry_longer")   # "again": ask once more with longer_budget(params)

Details (``guided: auto|on|off``, ``on_truncated``): docs/ARCHITECTURE.md (Guided decoding: Enforcement, Truncation).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from memreader.core.config import field
from memreader.core.generation.params import GenerationParams, Reply
from memreader.core.memory_grammar import (
    BoundaryGraph,
    GrammarBudgetError,
    GrammarPlan,
    GrammarSettings,
    GuidanceError,
    memory_grammar,
)
from memreader.core.windowing import WindowPlan, grammar_chars, plan_windows

log = logging.getLogger(__name__)

GUIDED_MODES = ("auto", "on", "off")
TRUNCATION_POLICIES = ("retry_longer", "skip", "keep_flagged")


def wants_grammar(mode: str, backend: str) -> bool:
    """Whether a stage builds grammars: ``off`` never; ``on``/``auto`` for every backend (an
    OpenAI-compatible client then sends them only to servers that take them, and says so)."""
    if mode not in GUIDED_MODES:
        raise ValueError(f"guided={mode!r} must be one of {', '.join(GUIDED_MODES)}")
    return mode != "off" and backend in ("local", "transformers", "vllm", "openai")


def approx_tokens(text: str) -> int:
    """A tokenizer-free estimate (UTF-8 bytes / 3: one token per CJK character, about 3 English
    characters per token) for endpoints whose tokenizer is not at hand; a tokenizer that needs more
    can cut a reply off, which the truncation policy then handles."""
    return math.ceil(len(text.encode("utf-8")) / 3) + 1


def count_tokens_for(backend: Any) -> Callable[[str], int]:
    """Token counting in the backend's own tokenizer when it has one, else :func:`approx_tokens`."""
    get = getattr(backend, "tokenizer", None)
    if get is None:
        return approx_tokens
    tok = get()
    return lambda text: len(tok.encode(text, add_special_tokens=False))


@dataclass
class GuidedConfig:
    """The guided-decoding keys every generating stage config shares (``gen``, ``read``)."""

    guided: str = field("auto", help="grammar-guided decoding: auto (on for local/transformers/vllm; for openai, "
                        "on when the server takes grammars, e.g. vLLM), on, off (free text, then parser + aligner)")
    on_truncated: str = field("retry_longer", help="a reply cut off by its token budget: retry_longer (once, twice "
                              "the budget, then skip), skip, or keep_flagged (written flagged meta.truncated, never "
                              "an SFT target)")
    min_chunk_chars: int = field(150, ge=1, help="guided: shortest chunk in characters (English; CJK divides by "
                                 "cjk_char_weight)")
    max_chunk_chars: int = field(1200, ge=1, help="guided: longest chunk in characters (English; CJK divides by "
                                 "cjk_char_weight)")
    cjk_char_weight: float = field(2.5, ge=1, help="how many English characters one CJK character counts as")
    core_tokens: int = field(80, ge=1, help="guided: most tokens per core content (shrunk to fit max_new_tokens)")
    topic_tokens: int = field(24, ge=1, help="guided: most tokens per outline line (shrunk to fit max_new_tokens)")

    def grammar_settings(self, head_chars: int, tail_chars: int, max_scenarios: int,
                         think_tokens: int = 0) -> GrammarSettings:
        """The memory-grammar settings of these keys plus the stage's marker shape and chunk count."""
        return GrammarSettings(
            head_chars=head_chars, tail_chars=tail_chars, min_chunk_chars=self.min_chunk_chars,
            max_chunk_chars=self.max_chunk_chars, cjk_char_weight=self.cjk_char_weight, max_scenarios=max_scenarios,
            core_tokens=self.core_tokens, topic_tokens=self.topic_tokens, think_tokens=think_tokens)

    def guided_problems(self, **marker: int) -> list[str]:
        """Invalid guided keys (``marker``: the ``grammar_settings`` arguments of the stage)."""
        problems = []
        if self.guided not in GUIDED_MODES:
            problems.append(f"guided: {self.guided!r} is not one of {', '.join(GUIDED_MODES)}")
        if self.on_truncated not in TRUNCATION_POLICIES:
            problems.append(f"on_truncated: {self.on_truncated!r} is not one of {', '.join(TRUNCATION_POLICIES)}")
        try:
            self.grammar_settings(**marker)
        except ValueError as exc:
            problems.append(str(exc))
        return problems


@dataclass
class MemoryGrammars:
    """Builds each document's memory grammar, sized to a token budget.

    ``may_go_unguided``: the backend may not take grammars anyway (an OpenAI-compatible endpoint
    with ``guided=auto``), so a document without a possible grammar is asked unguided (warned)
    instead of being refused.
    """

    settings: GrammarSettings
    count_tokens: Callable[[str], int]
    may_go_unguided: bool = False

    def plan(self, texts: Sequence[str], max_new_tokens: int, needs: dict[int, int] | None = None,
             breaks: Sequence[Sequence[int]] | None = None) -> tuple[list[GrammarPlan | None], dict[int, str]]:
        """One plan per text; a text that cannot be guided gets None and, unless it may go unguided,
        its error message in ``errors`` (the caller refuses it before any model call). ``needs`` collects
        the tokens each text's grammar would need when that is over ``max_new_tokens``; ``breaks`` are each
        text's structural breaks (heading and page starts: preferred chunk ends)."""
        plans: list[GrammarPlan | None] = []
        errors: dict[int, str] = {}
        for i, text in enumerate(texts):
            try:
                graph = BoundaryGraph.build(text, self.settings, breaks[i] if breaks else ())
                plans.append(memory_grammar(graph, self.settings, max_new_tokens, self.count_tokens))
            except GuidanceError as exc:
                if isinstance(exc, GrammarBudgetError) and needs is not None:
                    needs[i] = exc.need
                plans.append(None)
                if self.may_go_unguided:
                    log.warning("text %d: no grammar possible (%s); asking unguided", i, exc)
                else:
                    errors[i] = str(exc)
        return plans, errors


FIT_ROUNDS = 6
"""Times :func:`plan_guided_windows` cuts a document into smaller windows before it refuses it."""


def plan_guided_windows(texts: Sequence[str], grammars: MemoryGrammars | None, grammar_budget: int,
                        breaks: Sequence[Sequence[int]] | None = None,
                        **sizing: Any) -> tuple[WindowPlan, list[GrammarPlan | None], dict[int, str]]:
    """:func:`memreader.core.windowing.plan_windows` (``sizing``: its keyword arguments), one grammar per window (None
    when unguided) and the refused windows' messages. A window whose grammar needs more than ``grammar_budget`` tokens
    (small CJK chunks under a tight budget: every chunk marker costs tokens) is not refused at once: its document is
    cut again, up to :data:`FIT_ROUNDS` times. ``breaks``: each document's heading and page starts."""
    scale: dict[int, float] = {}
    grammar = sizing.get("grammar")
    for cuts in range(FIT_ROUNDS + 1):  # the plan after the last re-cut is checked too
        wplan = plan_windows(texts, scale=scale, **sizing)
        flat = wplan.flat()
        if grammars is None:
            return wplan, [None] * len(flat), {}
        needs: dict[int, int] = {}
        window_breaks = None
        if breaks:
            window_breaks = [[b - w.start for b in breaks[d] if w.start < b < w.end] for d, w in flat]
        plans, errors = grammars.plan(wplan.texts(texts), grammar_budget, needs, window_breaks)
        shrink: dict[int, float] = {}
        for j, need in needs.items():
            d, window = flat[j]
            factor = scale.get(d, 1.0) * 0.9 * grammar_budget / need
            if grammar is not None:
                # a window shorter than the grammar's capacity (a short text whose markers cost many tokens) is
                # cut only when the capacity falls below the window's own length: scale from that length
                capacity = grammar_chars(texts[d], grammar)
                factor = min(factor, 0.9 * grammar_budget / need * (window.end - window.start) / capacity)
            shrink[d] = min(shrink.get(d, 1.0), factor)
        if not shrink or cuts == FIT_ROUNDS:
            break
        scale.update(shrink)
        log.info("%d document(s) cut into smaller windows so that their grammars fit max_new_tokens=%d",
                 len(shrink), grammar_budget)
    return wplan, plans, errors


def settle_reply(reply: Any, on_truncated: str, retried: bool = False) -> tuple[Any, str]:
    """A reply (plain strings become :class:`Reply`) and its fate under the truncation policy: ``ok``; ``retried``
    (complete on the second ask, ``retried=True``); ``again`` (cut off under ``retry_longer`` the first time: ask once
    more with :func:`longer_budget`); ``truncated-skipped`` (the caller must not write it); ``truncated-kept``
    (``keep_flagged``: write it flagged); ``error`` (a request error, passed through)."""
    if on_truncated not in TRUNCATION_POLICIES:
        raise ValueError(f"on_truncated={on_truncated!r} must be one of {', '.join(TRUNCATION_POLICIES)}")
    if isinstance(reply, str) and not isinstance(reply, Reply):  # a backend that reports nothing about its replies
        reply = Reply(reply)
    if not isinstance(reply, Reply):
        return reply, "error"
    if not reply.truncated:
        return reply, "retried" if retried else "ok"
    if on_truncated == "retry_longer" and not retried:
        return reply, "again"
    return reply, "truncated-kept" if on_truncated == "keep_flagged" else "truncated-skipped"


def longer_budget(params: GenerationParams) -> GenerationParams:
    """The settings of the second ask after a cut-off reply: twice the token budget."""
    return replace(params, max_new_tokens=params.max_new_tokens * 2)


async def ask_with_policy(ask: Callable[[GenerationParams], Awaitable[Any]], params: GenerationParams,
                          on_truncated: str = "retry_longer") -> tuple[Any, str]:
    """One reply and its final fate (:func:`settle_reply`; a cut-off reply under ``retry_longer`` is asked once
    more with twice the budget); ``ask(params)`` returns a reply or a request error."""
    reply, fate = settle_reply(await ask(params), on_truncated)
    if fate == "again":
        log.info("a reply hit max_new_tokens=%d; asking again with %d", params.max_new_tokens,
                 longer_budget(params).max_new_tokens)
        reply, fate = settle_reply(await ask(longer_budget(params)), on_truncated, retried=True)
    return reply, fate


def count_fates(fates: Sequence[str]) -> dict[str, int]:
    """How many replies met each fate (for manifests and summary lines)."""
    return {f: fates.count(f) for f in sorted(set(fates))}
