"""Informational support of retrieved context for the reference answer (MoM paper §4.4, Table 3):
``S(A | C) = -1/m · Σ_i log P(a_i | prompt(q, C), a_<i)``, lower is better.

    scores = informational_support(model, tokenizer, items)          # one SupportScore per item
    scores = support_for_answers(chat, questions, contexts, answers)  # the answering engine's own model

Details (the prompt, several references, truncation, vLLM and transformers paths): docs/EVALUATION.md
(Informational support and clarity).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memreader.core.errors import MemReaderError
from memreader.core.prompts import load_template
from memreader.core.scoring_engines import TokenNLL
from memreader.eval.answering import answer_messages

log = logging.getLogger(__name__)

#: Bump when the prompt, the answer tokens or the formula above change (it is in every signature).
SUPPORT_VERSION = "1"
MULTI_REF = ("first", "min")


class SupportError(MemReaderError, ValueError):
    """Inputs the support score cannot be computed from."""


@dataclass(frozen=True)
class SupportItem:
    """One question, the chunks retrieved for it (best first) and its reference answer(s)."""

    question: str
    contexts: Sequence[str]
    answers: str | Sequence[str]


@dataclass(frozen=True)
class SupportScore:
    """``nll`` = S of one item (None: blank reference), over ``n_tokens`` answer tokens."""

    nll: float | None
    n_tokens: int
    truncated: bool
    context_chunks: int = 0
    answer_index: int | None = None  # which reference was scored


def prompt_ids(tokenizer: Any, question: str, chunks: Sequence[str]) -> list[int]:
    """Token ids of the answering prompt (:func:`memreader.eval.answering.answer_messages`, the QA stage's own
    prompt) with the assistant turn opened, as :func:`memreader.core.generation.local.generate_chat_batch`
    tokenizes it."""
    text = tokenizer.apply_chat_template(answer_messages(question, chunks), add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _references(answers: str | Sequence[str], multi_ref: str) -> list[tuple[int, str]]:
    refs = [answers] if isinstance(answers, str) else list(answers)
    kept = [(i, str(a).strip()) for i, a in enumerate(refs) if str(a).strip()]
    return kept[:1] if multi_ref == "first" else kept


def _fit(tokenizer: Any, item: SupportItem, answer: list[int], limit: int | None) -> tuple[list[int], list[int], int, bool]:
    """(prompt ids, answer ids, chunks kept, truncated) within ``limit`` tokens (see module docstring)."""
    chunks = list(item.contexts)
    ids = prompt_ids(tokenizer, item.question, chunks)
    if limit is None or len(ids) + len(answer) <= limit:
        return ids, answer, len(chunks), False
    while chunks and len(ids) + len(answer) > limit:
        chunks.pop()
        ids = prompt_ids(tokenizer, item.question, chunks)
    if len(ids) + len(answer) > limit:
        if len(ids) >= limit:
            raise SupportError(f"the answering prompt alone has {len(ids)} tokens with no context, over "
                               f"max_context_tokens={limit}", "raise max_context_tokens or shorten the question")
        answer = answer[: limit - len(ids)]
    return ids, answer, len(chunks), True


def informational_support(model: Any, tokenizer: Any, items: Sequence[SupportItem],
                          batch_size: int = 8, max_context_tokens: int | None = None, multi_ref: str = "first",
                          slice_tokens: int = 256) -> list[SupportScore]:
    """One :class:`SupportScore` per item (see the module docstring for the exact definition)."""
    if multi_ref not in MULTI_REF:
        raise SupportError(f"multi_ref={multi_ref!r} is not one of {', '.join(MULTI_REF)}")
    vllm_engine = hasattr(model, "llm") and hasattr(model, "max_model_len")  # a memreader.core.vllm_engine.Engine
    # vLLM needs one position past the prompt (it generates a token to return prompt log-probabilities)
    window = model.max_model_len - 1 if vllm_engine else getattr(model.config, "max_position_embeddings", None)
    limit = max_context_tokens if max_context_tokens is not None else (window or None)
    start = time.perf_counter()
    jobs: list[tuple[int, int, int, bool]] = []  # (item, reference index, chunks kept, truncated)
    sequences: list[tuple[list[int], int]] = []
    for n, item in enumerate(items):
        for ref_index, ref in _references(item.answers, multi_ref):
            answer = list(tokenizer(ref, add_special_tokens=False)["input_ids"])
            ids, answer, kept, truncated = _fit(tokenizer, item, answer, limit)
            if not answer:
                continue
            jobs.append((n, ref_index, kept, truncated))
            sequences.append((ids + answer, len(ids)))
    if vllm_engine:
        from memreader.core.vllm_engine import prompt_nlls

        nlls = prompt_nlls(model, sequences)
    else:
        nlls = TokenNLL(model, tokenizer, batch_size=batch_size, slice_tokens=slice_tokens).nlls(
            [s for s, _ in sequences], [range(start, len(s)) for s, start in sequences])
    best: dict[int, SupportScore] = {}
    for (n, ref_index, kept, truncated), values in zip(jobs, nlls, strict=True):
        score = SupportScore(float(values.mean()), len(values), truncated, kept, ref_index)
        if n not in best or score.nll < best[n].nll:  # type: ignore[operator]
            best[n] = score
    seconds = time.perf_counter() - start
    tokens = sum(len(s) for s, _ in sequences)
    log.info("support: %d items, %d sequences, %d tokens (%d answer tokens) in %.2f s = %.0f tokens/s",
             len(items), len(sequences), tokens, sum(len(v) for v in nlls), seconds, tokens / max(seconds, 1e-9))
    return [best.get(n, SupportScore(None, 0, False, len(item.contexts))) for n, item in enumerate(items)]


def support_signature(model_name: str, multi_ref: str = "first", max_context_tokens: int | None = None,
                      dtype: str = "float32") -> str:
    """What a support score depends on besides the data (equal signatures: comparable numbers)."""
    templates = ",".join(load_template("qa_answer", lang).id for lang in ("en", "zh"))
    return (f"Support|model:{model_name}|tpl:{templates}|chat:assistant-open|answer:strip,no-eos|refs:{multi_ref}|"
            f"ctx:{max_context_tokens or 'model'}|drop:last-chunks|dtype:{dtype}|mr-support:{SUPPORT_VERSION}")


def support_for_answers(answerer: Any, questions: Sequence[str], contexts: Sequence[Sequence[str]],
                        answers: Sequence[str | Sequence[str]], batch_size: int = 8) -> list[SupportScore]:
    """:func:`informational_support` from parallel lists. ``answerer``: a ``(model, tokenizer)`` pair,
    a :class:`memreader.core.generation.LocalChat` (its already-loaded model is reused), or a
    :class:`memreader.core.generation.vllm_chat.VLLMChat` (its engine's ``prompt_logprobs``)."""
    if not len(questions) == len(contexts) == len(answers):
        raise SupportError(f"{len(questions)} questions, {len(contexts)} contexts and {len(answers)} answers: "
                           "the three lists must align")
    if isinstance(answerer, tuple):
        model, tokenizer = answerer
    elif hasattr(answerer, "engine") and hasattr(answerer.engine, "llm"):  # VLLMChat
        model, tokenizer = answerer.engine, answerer.tokenizer()
    elif hasattr(answerer, "model") and hasattr(answerer, "tokenizer"):
        model, tokenizer = answerer.model(), answerer.tokenizer()
    else:
        raise SupportError(f"cannot get a model from {type(answerer).__name__}",
                           "pass a (model, tokenizer) pair, a LocalChat or a VLLMChat")
    items = [SupportItem(q, c, a) for q, c, a in zip(questions, contexts, answers, strict=True)]
    return informational_support(model, tokenizer, items, batch_size)
