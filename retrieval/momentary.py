"""Momentary context reconstruction (Jeong 2024): the context of a new question, rebuilt from stored turns.

Every question gets the most recent stored turn plus the ``top_k`` most relevant earlier ones (``weighted`` or
``rrf`` fusion of BM25 and cosines), cut to ``max_tokens`` in priority order, then sorted chronologically. The
result, :class:`MomentaryContext`, records every turn's scores, tokens and what was cut and why. Storage and
search live in :mod:`memreader.retrieval.conversation_store`; this module only decides.
Details: docs/MOMENTARY.md (Building a context).
"""

from __future__ import annotations

import math
import textwrap
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from memreader.core.config import validate as validate_config
from memreader.core.errors import MemReaderError
from memreader.core.fusion import RRF_K, reciprocal_rank_fusion, rrf_k_problem
from memreader.retrieval.conversation_store import BM25, ConversationStore, Turn, check_conversation_id
from memreader.retrieval.token_counter import TokenCounter

__all__ = ["FUSIONS", "ContextTurn", "CutTurn", "MomentaryContext", "MomentaryError", "MomentarySettings",
           "Normalisation", "TokenCounter", "build_context", "format_context", "fuse", "longest_suffix", "render_turn"]

FUSIONS = ("weighted", "rrf")


class MomentaryError(MemReaderError, ValueError):
    """A question or setting cannot give a context."""


@dataclass
class MomentarySettings:
    """How a momentary context is built."""

    weights: dict[str, float]
    """Signal → weight: ``bm25`` and embedder names; weight 0 switches a signal off."""
    top_k: int = 8
    candidates: int = 50
    fusion: str = "weighted"
    rrf_k: float = RRF_K
    max_tokens: int = 1024

    def problems(self) -> list[str]:
        """Every problem with the values (empty when fine)."""
        out = []
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1:
            out.append(f"top_k={self.top_k!r} must be an integer >= 1 (how many past turns to retrieve, e.g. 8)")
        if not isinstance(self.candidates, int) or self.candidates < 1:
            out.append(f"candidates={self.candidates!r} must be an integer >= 1 (turns each signal proposes)")
        elif isinstance(self.top_k, int) and self.candidates < self.top_k:
            out.append(f"candidates={self.candidates} is below top_k={self.top_k}: raise candidates to >= top_k")
        if self.fusion not in FUSIONS:
            out.append(f"fusion={self.fusion!r} is not one of {', '.join(FUSIONS)}")
        if problem := rrf_k_problem(self.rrf_k):
            out.append(problem)
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            out.append(f"max_tokens={self.max_tokens!r} must be an integer >= 1 (L_max, e.g. 1024)")
        bad = {s: w for s, w in self.weights.items() if not (isinstance(w, (int, float)) and math.isfinite(w) and w >= 0)}
        if bad:
            out.append(f"weights {bad} must be finite numbers >= 0")
        elif not any(w > 0 for w in self.weights.values()):
            out.append(f"weights {self.weights} switch every signal off: give bm25 or an embedder a weight > 0")
        return out

    @property
    def active(self) -> list[str]:
        """Signals with a weight > 0, in the order given."""
        return [s for s, w in self.weights.items() if w > 0]


@dataclass(frozen=True)
class Normalisation:
    """Min-max normalisation of one signal over the candidate set."""

    signal: str
    low: float
    high: float
    method: str = "min-max"

    @property
    def degenerate(self) -> bool:
        """All candidates scored the same: the signal cannot tell them apart and adds 0 to each."""
        return self.high == self.low

    def apply(self, value: float) -> float:
        """``(value - low) / (high - low)``, 0 when degenerate."""
        return 0.0 if self.degenerate else (value - self.low) / (self.high - self.low)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form, with ``degenerate``."""
        return {**asdict(self), "degenerate": self.degenerate}


@dataclass
class Fused:
    """Fusion of a candidate set: fused score, normalised scores and ranks per signal."""

    scores: dict[int, float]
    order: list[int]
    """Candidate turn indices, best first (ties: more recent first)."""
    normalised: dict[str, dict[int, float]]
    ranks: dict[str, dict[int, int]]
    normalisation: dict[str, Normalisation]


def _ranking(scores: Mapping[int, float], skip_zero: bool) -> list[int]:
    kept = [i for i, s in scores.items() if not (skip_zero and s <= 0)]
    return sorted(kept, key=lambda i: (-scores[i], -i))


def fuse(raw: Mapping[str, Mapping[int, float]], weights: Mapping[str, float], fusion: str = "weighted",
         rrf_k: float = RRF_K) -> Fused:
    """Fuse raw scores (signal → turn → score, every signal scoring the same turns) of the signals with a weight
    > 0 by ``fusion`` (see the module docstring)."""
    if fusion not in FUSIONS:
        raise MomentaryError(f"fusion={fusion!r} is not one of {', '.join(FUSIONS)}")
    active = [s for s in raw if weights.get(s, 0) > 0]
    keys = set(next(iter(raw.values()), {}))
    assert all(set(v) == keys for v in raw.values()), "every signal must score the same candidates"
    norms = {s: Normalisation(s, min(v.values()), max(v.values())) if v else Normalisation(s, 0.0, 0.0)
             for s, v in raw.items()}
    normalised = {s: {i: norms[s].apply(x) for i, x in v.items()} for s, v in raw.items()}
    rankings = {s: _ranking(v, skip_zero=s == BM25) for s, v in raw.items()}
    ranks = {s: {i: r for r, i in enumerate(order, start=1)} for s, order in rankings.items()}
    if fusion == "weighted":
        scores = {i: math.fsum(weights[s] * normalised[s][i] for s in active) for i in keys}
    else:
        fused = dict(reciprocal_rank_fusion([rankings[s] for s in active], k=rrf_k))
        scores = {i: fused.get(i, 0.0) for i in keys}
    order = sorted(keys, key=lambda i: (-scores[i], -i))
    return Fused(scores, order, normalised, ranks, norms)


def longest_suffix(counter: TokenCounter, speaker: str, text: str, budget: int) -> str | None:
    """The longest suffix ``s`` of ``text`` with ``counter.count(render_turn(speaker, s)) <= budget`` (None if
    not even one character fits). Cut on characters, so the result is exact text of the turn."""
    fits = lambda start: counter.count(render_turn(speaker, text[start:])) <= budget  # noqa: E731
    lo, hi = 0, len(text) - 1  # the answer (first start that fits) lies in [lo, hi] if the last char fits
    if hi < 0 or not fits(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return text[lo:]


def render_turn(speaker: str, text: str) -> str:
    """How a turn appears in the context block (its tokens are counted in this form).

    The text is stripped so no whitespace run spans a line end: the tokens of the lines then add
    up to the tokens of the block (byte-level BPE never merges a newline with the next speaker).
    """
    return f"{speaker}: {text.strip()}\n"


@dataclass
class ContextTurn:
    """One turn placed in the context, with its scores."""

    turn: Turn
    text: str
    """What the context holds: the turn's text, or its longest fitting suffix when ``truncated``."""
    tokens: int
    """Tokens of ``render_turn(speaker, text)``."""
    recent: bool
    truncated: bool
    rank: int | None
    """Fused rank among the earlier turns (1 = best); None for the most recent turn."""
    score: float
    raw: dict[str, float]
    normalised: dict[str, float]
    signal_ranks: dict[str, int | None]

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return {"turn": self.turn.index, "speaker": self.turn.speaker, "timestamp": self.turn.timestamp,
                "text": self.text, "tokens": self.tokens, "recent": self.recent, "truncated": self.truncated,
                "rank": self.rank, "score": self.score, "raw": self.raw, "normalised": self.normalised,
                "signal_ranks": self.signal_ranks}


@dataclass
class CutTurn:
    """A top-k turn left out by the L_max cut."""

    turn: int
    rank: int
    score: float
    tokens: int
    reason: str


@dataclass
class MomentaryContext:
    """The reconstructed context of one question."""

    conversation: str
    question: str
    question_tokens: int
    turns: list[ContextTurn]
    """Chronological."""
    cut: list[CutTurn]
    normalisation: dict[str, Normalisation]
    settings: dict[str, Any]
    stored_turns: int
    candidates: int
    tokenizer: str
    seconds: float = 0.0
    hits: dict[str, list[int]] = field(default_factory=dict)

    @property
    def context_tokens(self) -> int:
        """Tokens of the turns placed in the context."""
        return sum(t.tokens for t in self.turns)

    @property
    def tokens(self) -> int:
        """Question plus context: what L_max bounds."""
        return self.question_tokens + self.context_tokens

    def block(self) -> str:
        """The turns as they go into the prompt, oldest first."""
        return "".join(render_turn(t.turn.speaker, t.text) for t in self.turns)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (what `/context` shows and the chat log keeps)."""
        return {"conversation": self.conversation, "question": self.question,
                "question_tokens": self.question_tokens, "context_tokens": self.context_tokens,
                "tokens": self.tokens, "stored_turns": self.stored_turns, "candidates": self.candidates,
                "tokenizer": self.tokenizer, "settings": self.settings, "seconds": round(self.seconds, 4),
                "normalisation": {s: n.to_dict() for s, n in self.normalisation.items()},
                "turns": [t.to_dict() for t in self.turns], "cut": [asdict(c) for c in self.cut], "hits": self.hits}

    def format(self) -> str:
        """Human-readable table of the context with scores."""
        return format_context(self.to_dict())


def build_context(store: ConversationStore, conversation: str, question: str, settings: MomentarySettings,
                  counter: TokenCounter) -> MomentaryContext:
    """Rebuild the context of ``question`` from the turns of ``conversation`` (nothing is stored here)."""
    started = time.perf_counter()
    validate_config(settings, MomentaryError, "momentary context")  # one error naming every problem
    check_conversation_id(conversation)
    if not isinstance(question, str) or not question.strip():
        raise MomentaryError("the question is empty", "type a question")
    unknown = [s for s in settings.weights if s not in store.signals]
    if unknown:
        raise MomentaryError(f"weights name {unknown}, which the store does not hold (it has {store.signals})",
                             "weight only bm25 and the store's embedders")
    q_tokens = counter.count(question)
    if q_tokens >= settings.max_tokens:
        raise MomentaryError(
            f"the question has {q_tokens} tokens, which leaves no room under max_tokens (L_max) = "
            f"{settings.max_tokens} for the most recent turn", "shorten the question or raise max_tokens")
    record = dict(asdict(settings), tokenizer=counter.name)
    recent = store.recent(conversation)
    if recent is None:
        return MomentaryContext(conversation, question, q_tokens, [], [], {}, record, 0, 0, counter.name,
                                time.perf_counter() - started)
    found = store.score_candidates(conversation, question, settings.active, settings.candidates, include=[recent.index])
    fused = fuse(found.raw, settings.weights, settings.fusion, settings.rrf_k)
    past = [i for i in fused.order if i != recent.index]
    rank_of = {i: r for r, i in enumerate(past, start=1)}

    def placed(index: int, text: str, tokens: int, truncated: bool) -> ContextTurn:
        turn = found.turns[index]
        return ContextTurn(turn, text, tokens, index == recent.index, truncated, rank_of.get(index),
                           fused.scores[index], {s: v[index] for s, v in found.raw.items()},
                           {s: v[index] for s, v in fused.normalised.items()},
                           {s: v.get(index) for s, v in fused.ranks.items()})

    left = settings.max_tokens - q_tokens
    tokens = counter.count(render_turn(recent.speaker, recent.text))
    if tokens <= left:
        chosen = [placed(recent.index, recent.text, tokens, False)]
    else:
        suffix = longest_suffix(counter, recent.speaker, recent.text.strip(), left)
        if suffix is None:
            raise MomentaryError(
                f"the question has {q_tokens} tokens; the {left} left under max_tokens (L_max) = {settings.max_tokens} "
                "cannot hold even one character of the most recent turn", "shorten the question or raise max_tokens")
        chosen = [placed(recent.index, suffix, counter.count(render_turn(recent.speaker, suffix)), True)]
    left -= chosen[0].tokens
    cut: list[CutTurn] = []
    for index in past[: settings.top_k]:
        turn = found.turns[index]
        tokens = counter.count(render_turn(turn.speaker, turn.text))
        if cut:
            cut.append(CutTurn(index, rank_of[index], fused.scores[index], tokens,
                               f"turn {cut[0].turn} (rank {cut[0].rank}) was cut before it: strict priority order"))
        elif tokens > left:
            cut.append(CutTurn(index, rank_of[index], fused.scores[index], tokens,
                               f"needs {tokens} tokens, {left} left under max_tokens {settings.max_tokens}"))
        else:
            chosen.append(placed(index, turn.text, tokens, False))
            left -= tokens
    chosen.sort(key=lambda t: t.turn.index)
    return MomentaryContext(conversation, question, q_tokens, chosen, cut, fused.normalisation, record,
                            recent.index + 1, len(found.turns), counter.name,
                            time.perf_counter() - started, found.hits)


def format_context(record: Mapping[str, Any], max_chars: int = 160) -> str:
    """A context record (:meth:`MomentaryContext.to_dict`) as text: one line per turn with its scores."""
    s = record["settings"]
    weights = ", ".join(f"{k}={v:g}" for k, v in s["weights"].items())
    fusion = f"rrf (k={s['rrf_k']:g})" if s["fusion"] == "rrf" else s["fusion"]
    lines = [
        f"question ({record['question_tokens']} tokens): {record['question']}",
        f"context: {len(record['turns'])} of {record['stored_turns']} stored turns, {record['tokens']} tokens "
        f"(question {record['question_tokens']} + turns {record['context_tokens']}) of max_tokens {s['max_tokens']}; "
        f"fusion {fusion}, weights {weights}, "
        f"top_k {s['top_k']}, {record['candidates']} candidates, tokenizer {record['tokenizer']}",
    ]
    for name, n in record["normalisation"].items():
        note = " (all equal: adds 0)" if n["degenerate"] else ""
        lines.append(f"  norm {name}: {n['method']} over candidates, min {n['low']:.4f} max {n['high']:.4f}{note}")
    for t in record["turns"]:
        tag = "recent" if t["recent"] else f"#{t['rank']}"
        sig = "  ".join(f"{k} {v:.3f}->{t['normalised'][k]:.2f}" for k, v in t["raw"].items())
        text = t["text"] if len(t["text"]) <= max_chars else t["text"][:max_chars] + " ..."
        when = datetime.fromtimestamp(t["timestamp"], tz=timezone.utc)
        lines.append(f"[turn {t['turn']}] {t['speaker']} {when:%Y-%m-%d %H:%M:%S} {tag:>6} score {t['score']:.4f} "
                     f"{t['tokens']} tok{' (truncated)' if t['truncated'] else ''}  {sig}")
        lines.append(textwrap.indent(text.strip(), "    "))
    for c in record["cut"]:
        lines.append(f"cut turn {c['turn']} (rank {c['rank']}, score {c['score']:.4f}, {c['tokens']} tokens): {c['reason']}")
    return "\n".join(lines)
