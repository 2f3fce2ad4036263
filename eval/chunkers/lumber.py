"""LumberChunker (Duarte et al., 2024): an LM asked, window by window, where the topic shifts.

Sentence units fill a window of about ``window_chars`` characters; the LM, guided to ``Answer: ID nnnn``, names
the first unit whose content differs, and the chunk ends before it. Every document's window goes into one batched
``generate_many``; answers are cached in ``lumber/answers.jsonl`` under the chunk cache.
Details (``min_share``, passages longer than the window, why not chonkie's SlumberChunker): docs/CHUNKERS.md
(Why LumberChunker is hand-written; Passages longer than the window).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

from memreader.core.generation import GenerationParams
from memreader.eval.chunkers.base import ChunkerError, sentence_spans
from memreader.eval.chunkers.calibrate import SizeParam

log = logging.getLogger(__name__)

PROMPT = (
    "You will receive as input a document with passages identified by 'ID XXXX: <text>'.\n\n"
    "Task: Find the first passage (not the first one) where the content clearly changes compared to the "
    "previous passages.\n\n"
    "Output: Return the ID of the passage with the content shift as in the exemplified format: "
    "'Answer: ID XXXX'.\n\n"
    "Additional Considerations: Avoid very long groups of passages. Aim for a good balance between "
    "identifying content shifts and keeping groups manageable.\n\n"
    "Document:\n{passages}"
)
"""LumberChunker's prompt (Duarte et al., 2024, Fig. 2), "paragraphs" read as "passages"."""
ANSWER_PREFIX = "Answer: ID "
_ANSWER = re.compile(r"Answer: ID (\d+)\s*$")
PARAMS = GenerationParams(temperature=0.0, top_p=1.0, max_new_tokens=16)


def lumber_param(target: int) -> SizeParam:
    """The window budget in characters; the cut lands between ``min_share`` of it and its end."""
    return SizeParam("window_chars", lo=1, hi=40 * target, start=round(1.6 * target))


def unit_id(i: int) -> str:
    return f"{i:04d}"


def window_end(units: Sequence[tuple[int, int]], start: int, window_chars: float) -> int:
    """Exclusive end unit of the window from ``start``: units until ``window_chars`` characters are
    reached (the unit that reaches it included), and at least two units while there are two."""
    end, size = start, 0
    while end < len(units) and (size < window_chars or end - start < 2):
        size += units[end][1] - units[end][0]
        end += 1
    return end


def valid_answers(units: Sequence[tuple[int, int]], start: int, end: int, min_chars: float) -> list[int]:
    """IDs the LM may name: units after the first whose chunk (start .. ID) would hold at least
    ``min_chars`` characters; the window's last unit always."""
    ok = [u for u in range(start + 1, end) if units[u][0] - units[start][0] >= min_chars]
    return ok or [end - 1]


def shown(passage: str, max_chars: float) -> str:
    """A passage as the LM sees it: whitespace runs as one space, cut after ``max_chars`` characters ("…")."""
    passage = " ".join(passage.split())
    cut = max(1, int(max_chars))
    return passage if len(passage) <= cut else passage[:cut] + "…"


def window_prompt(text: str, units: Sequence[tuple[int, int]], start: int, end: int,
                  valid: Sequence[int], max_chars: float) -> tuple[list[dict], str]:
    """The chat messages of one window (each passage cut to ``max_chars``) and the grammar that allows only the
    ``valid`` IDs."""
    passages = "\n".join(f"ID {unit_id(i)}: " + shown(text[s:e], max_chars) for i, (s, e) in
                         enumerate(units[start:end], start))
    choices = " | ".join(json.dumps(unit_id(i)) for i in valid)
    grammar = f"%llguidance {{}}\nstart: {json.dumps(ANSWER_PREFIX)} ({choices})\n"
    return [{"role": "user", "content": PROMPT.format(passages=passages)}], grammar


def parse_answer(reply: str, valid: Sequence[int]) -> int:
    """The unit an answer names; an unusable answer is an error (a guided reply never is one)."""
    m = _ANSWER.search(str(reply).strip())
    if not m or int(m.group(1)) not in valid:
        raise ChunkerError(f"lumber: the LM answered {str(reply)[:80]!r}, not 'Answer: ID n' with n in "
                           f"{valid[0]}..{valid[-1]}", "use a backend that takes grammars (guided decoding)")
    return int(m.group(1))


class AnswerCache:
    """LM answers on disk, one JSON line each, keyed by a hash of model, engine, messages and grammar (so runs
    that share the file share only answers the same model on the same engine and dtype gave)."""

    def __init__(self, path: Path, model: str, engine: str = "") -> None:
        self.path, self.model, self.engine = path, model, engine
        self.answers: dict[str, int] = {}
        if path.is_file():
            lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
            for n, line in enumerate(lines, 1):
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    if n == len(lines) and not line.endswith("\n"):
                        log.warning("%s: dropping a half-written last line from an interrupted run", path)
                        path.write_text("".join(lines[:-1]), encoding="utf-8")
                        break
                    raise ChunkerError(f"{path}:{n}: not valid JSON", "delete the file to ask the LM again") from None
                self.answers[rec["key"]] = int(rec["answer"])

    def key(self, messages: list[dict], grammar: str) -> str:
        blob = json.dumps({"model": self.model, "engine": self.engine, "messages": messages, "grammar": grammar,
                           "params": PARAMS.key()}, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def put(self, key: str, answer: int, reply: str, doc_id: str) -> None:
        self.answers[key] = answer
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"key": key, "answer": answer, "reply": reply, "doc_id": doc_id},
                                ensure_ascii=False) + "\n")


class LumberChunker:
    """LumberChunker over a chat backend (``generate_many`` with ``grammars``), answers cached."""

    def __init__(self, client: Any, cache: AnswerCache, min_share: float = 0.5, progress: bool = False) -> None:
        if not 0 <= min_share < 1:
            raise ChunkerError(f"lumber: min_share={min_share} must be in [0, 1)", "use e.g. 0.5, or 0 for none")
        self.client, self.cache, self.min_share, self.progress = client, cache, min_share, progress
        self.calls = 0  # LM calls made by this object (cached answers are not calls)
        self.forced = 0  # windows with one allowed ID, cut there without a call

    def spans(self, documents: dict[str, str], window_chars: float) -> dict[str, list[tuple[int, int]]]:
        """Spans per document; every round asks all documents' current windows in one batch."""
        units = {d: sentence_spans(t) for d, t in documents.items()}
        cuts: dict[str, list[int]] = {d: [0] for d in documents}  # unit indices where chunks start
        pending = {d for d in documents if len(units[d]) > 0}
        while pending:
            asks = []  # (doc, valid IDs, messages, grammar, key)
            for d in sorted(pending):
                start = cuts[d][-1]
                end = window_end(units[d], start, window_chars)
                if end - start < 2:  # a lone last unit: no choice to ask about
                    cuts[d].append(end)
                    continue
                valid = valid_answers(units[d], start, end, self.min_share * window_chars)
                if len(valid) == 1:  # no choice: the grammar would force this answer
                    cuts[d].append(valid[0])
                    self.forced += 1
                    continue
                messages, grammar = window_prompt(documents[d], units[d], start, end, valid, window_chars)
                key = self.cache.key(messages, grammar)
                if key in self.cache.answers:
                    cuts[d].append(self._checked(self.cache.answers[key], valid, d))
                else:
                    asks.append((d, valid, messages, grammar, key))
            if asks:
                self._ask(asks)
                for d, valid, _, _, key in asks:
                    cuts[d].append(self._checked(self.cache.answers[key], valid, d))
            pending = {d for d in pending if cuts[d][-1] < len(units[d])}
        return {d: list(pairwise([units[d][i][0] for i in cuts[d][:-1]] + [len(text)]))
                for d, text in documents.items()}

    def _checked(self, answer: int, valid: Sequence[int], doc_id: str) -> int:
        if answer not in valid:
            raise ChunkerError(f"lumber: cached answer {answer} for {doc_id!r} is not one of {list(valid)}",
                               f"delete {self.cache.path} to ask the LM again")
        return answer

    def _ask(self, asks: list[tuple]) -> None:
        def on_reply(i: int, reply: Any) -> None:
            d, valid, _, _, key = asks[i]
            if isinstance(reply, Exception):
                return
            self.cache.put(key, parse_answer(reply, valid), str(reply), d)

        replies = self.client.generate_many([a[2] for a in asks], PARAMS, progress_desc="lumber" if self.progress
                                            else None, on_reply=on_reply, return_exceptions=True,
                                            grammars=[a[3] for a in asks])
        self.calls += len(asks)
        failed = [(a[0], r) for a, r in zip(asks, replies, strict=True) if isinstance(r, Exception)]
        if failed:
            raise ChunkerError(f"lumber: {len(failed)} LM call(s) failed, e.g. for {failed[0][0]!r}: {failed[0][1]}",
                               "fix the model or backend and rerun (answers already given are cached)")
        for (d, valid, _, _, key), reply in zip(asks, replies, strict=True):
            if key not in self.cache.answers:  # a backend that does not call on_reply
                self.cache.put(key, parse_answer(reply, valid), str(reply), d)
