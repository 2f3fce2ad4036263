"""Answer generation for the QA evaluation: the prompt, batched generation, and a profile of where time goes
(:class:`ForwardTimer` sums the wall time of the model's forward passes).

The same :func:`answer_messages` conditions the informational-support score (:mod:`memreader.eval.support`), so the
support of a reference answer is measured under exactly the prompt the answer was generated from;
:func:`answer_and_support` does both for a batch, each prompt prefilled once where the engine keeps a prefix cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from memreader.core.language import detect_language
from memreader.core.prompts import render


def answer_messages(question: str, chunks: Sequence[str]) -> list[dict[str, str]]:
    """Chat messages asking the answering model ``question`` over the numbered retrieved ``chunks``."""
    context = "\n\n".join(f"[{i + 1}] {c}" for i, c in enumerate(chunks))
    msgs, _ = render("qa_answer", detect_language(question), context=context, question=question)
    return msgs


def fit_chunks(answerer: Any, question: str, chunks: list[str], max_new_tokens: int) -> tuple[list[str], int]:
    """The retrieved ``chunks`` (best first) that fit the answering model's window with ``max_new_tokens`` to
    spare: the lowest-ranked ones are dropped until the prompt fits; returns the kept chunks and how many were
    dropped. An answerer whose tokenizer and window are unknown here (a remote endpoint) gets every chunk."""
    if not callable(getattr(answerer, "tokenizer", None)) or not callable(getattr(answerer, "model_window", None)):
        return chunks, 0
    window, tokenizer = answerer.model_window(), answerer.tokenizer()
    if not window:
        return chunks, 0
    kept = list(chunks)
    while kept:
        ids = tokenizer.apply_chat_template(answer_messages(question, kept), add_generation_prompt=True,
                                            tokenize=True, return_dict=True)["input_ids"]
        if len(ids) + max_new_tokens <= window:
            break
        kept.pop()
    return kept, len(chunks) - len(kept)


#: Share of the prefix cache a group of prompts may fill: the rest is room for what other requests keep there.
CACHE_SHARE = 0.9


@dataclass
class AnswerPass:
    """What :func:`answer_and_support` did for one batch: replies and support in prompt order, the wall time of
    each, and the groups it ran (one group: no prefix reuse)."""

    replies: list[Any]
    support: list[Any]
    generate_s: float = 0.0
    support_s: float = 0.0
    groups: list[list[int]] = field(default_factory=list)
    reuse: bool = False


def cache_groups(sizes: Sequence[int], budget: int) -> list[list[int]]:
    """Consecutive indices of ``sizes`` (tokens per request) in groups whose total is at most ``budget``; a
    request larger than the budget is a group of its own."""
    groups: list[list[int]] = []
    total = 0
    for i, n in enumerate(sizes):
        if not groups or total + n > budget:
            groups.append([])
            total = 0
        groups[-1].append(i)
        total += n
    return groups


def answer_and_support(answerer: Any, prompts: Sequence[Any], params: Any,
                       support: Callable[[list[int]], list[Any]] | None = None,
                       timer: ForwardTimer | None = None, reuse_prefix: bool = True,
                       on_done: Callable[[AnswerPass, list[int]], None] | None = None) -> AnswerPass:
    """Replies to ``prompts`` and, when ``support`` is given, ``support(indices)`` (the support scores of those
    prompts' items, in that order). ``on_done(pass, indices)`` is called as soon as those prompts have both (so a
    caller can save them before the next group runs).

    Where the answerer's engine keeps a prefix cache (vLLM: ``prefix_cache_tokens() > 0``), the prompts run in
    groups that fit that cache, each scored first and answered second: the scoring requests (``prompt_logprobs``,
    which never read the cache) still write the prompts' KV blocks to it, and the generation requests read them
    back, so a prompt is prefilled once instead of twice. Replies and scores are those of the two passes run apart
    (up to the last-bit noise that any cache hit brings; both orders measured in docs/BENCHMARKS.md)."""
    n = len(prompts)
    reuse = reuse_prefix and support is not None and callable(getattr(answerer, "prefix_cache_tokens", None))
    cache = int(answerer.prefix_cache_tokens()) if reuse else 0
    groups = cache_groups([answerer.prompt_tokens(p) + params.max_new_tokens for p in prompts],
                          int(CACHE_SHARE * cache)) if cache else [list(range(n))]
    out = AnswerPass([None] * n, [None] * n, groups=groups, reuse=bool(cache))

    def score(group: list[int]) -> None:
        t0 = time.perf_counter()
        if support is not None:
            for i, value in zip(group, support(group), strict=True):
                out.support[i] = value
        out.support_s += time.perf_counter() - t0

    for group in groups:
        if out.reuse:  # scoring first writes the prompts' KV blocks that the answers then read
            score(group)
        t0 = time.perf_counter()
        with timer if timer is not None else nullcontext():
            for i, reply in zip(group, answerer.generate_many([prompts[i] for i in group], params), strict=True):
                out.replies[i] = reply
        out.generate_s += time.perf_counter() - t0
        if not out.reuse:
            score(group)
        if on_done is not None:
            on_done(out, group)
    return out


class ForwardTimer:
    """Wall time spent inside ``model.forward`` (hooks on the top-level module), while active.

    On CUDA the end hook synchronises the device first, so the time is the forward's, not its launch's
    (that synchronisation itself slows generation slightly; on CPU there is none).
    """

    def __init__(self, model: Any) -> None:
        self.model, self.seconds, self.calls = model, 0.0, 0
        self._start: float | None = None
        self._handles: list[Any] = []

    def _sync(self) -> None:
        import torch

        if torch.cuda.is_available() and next(self.model.parameters()).is_cuda:
            torch.cuda.synchronize()

    def _pre(self, *_: Any, **__: Any) -> None:
        self._sync()
        self._start = time.perf_counter()

    def _post(self, *_: Any, **__: Any) -> None:
        self._sync()
        if self._start is not None:
            self.seconds += time.perf_counter() - self._start
            self.calls += 1
            self._start = None

    def __enter__(self) -> ForwardTimer:
        self._handles = [self.model.register_forward_pre_hook(self._pre, with_kwargs=True),
                         self.model.register_forward_hook(self._post, with_kwargs=True)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


@dataclass
class GenerationProfile:
    """Accumulates answer-generation wall time and forward time over several batches and methods."""

    generation_s: float = 0.0
    forward_s: float = 0.0
    forward_calls: int = 0
    answers: int = 0
    other: dict[str, float] = field(default_factory=dict)

    def add_generation(self, seconds: float, timer: ForwardTimer | None, answers: int) -> None:
        """One generate_many call: its wall time and, when timed, its forward time."""
        self.generation_s += seconds
        self.answers += answers
        if timer is not None:
            self.forward_s += timer.seconds
            self.forward_calls += timer.calls

    def add(self, name: str, seconds: float) -> None:
        """Time of another phase (index, retrieval, support, clarity, scoring)."""
        self.other[name] = round(self.other.get(name, 0.0) + seconds, 3)

    @property
    def forward_share(self) -> float | None:
        """Forward passes' share of the answer-generation wall time."""
        return round(self.forward_s / self.generation_s, 4) if self.generation_s > 0 and self.forward_calls else None

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (summary.json's ``profile``)."""
        return {"forward_share": self.forward_share, "answers": self.answers, "forward_calls": self.forward_calls,
                "seconds": {"generation": round(self.generation_s, 3), "forward": round(self.forward_s, 3),
                            **self.other}}

    def line(self) -> str:
        """The one-line profile summary printed at the end of a run."""
        share = self.forward_share
        share_txt = f"{100 * share:.1f}%" if share is not None else "n/a (not timed: a remote or vLLM answerer)"
        others = ", ".join(f"{k} {v:.1f}s" for k, v in self.other.items())
        return (f"profile: {self.answers} answers in {self.generation_s:.1f}s of generation, model forward passes "
                f"{share_txt} of it ({self.forward_calls} calls, goal >= 80%); {others}")
