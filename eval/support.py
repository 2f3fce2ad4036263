"""Informational support of retrieved context for the reference answer (MoM paper §4.4, Table 3).

    scores = informational_support(model, tokenizer, items)          # one SupportScore per item
    scores = support_for_answers("smollm2-135m-instruct", questions, contexts, answers)

For a question ``q``, its retrieved chunks ``C`` and a reference answer ``A = (a_1..a_m)`` (tokens of
the answering model), the support score is

    S(A | C) = -1/m · Σ_i log P(a_i | prompt(q, C), a_1..a_{i-1})           (lower is better)

Exactly what is computed:

* ``prompt(q, C)`` is the prompt the QA stage gives the answerer, from the same function
  (:func:`memreader.eval.answering.answer_messages`: the ``qa_answer`` template in the question's language with
  the context ``"\\n\\n".join(f"[{i+1}] {chunk}")``), through the model's chat template with the
  assistant turn opened (``add_generation_prompt=True``), tokenized without special tokens, as
  :func:`memreader.core.generation.local.generate_chat_batch` does.
* The answer is the assistant continuation: ``answer.strip()`` tokenized on its own without special
  tokens and appended to the prompt ids. Only answer tokens are scored; no end-of-turn token.
* ``log P`` is the fp32 log-softmax over the full vocabulary of the model's next-token logits.
* Several references: ``multi_ref="first"`` (default) scores the first non-blank one;
  ``multi_ref="min"`` scores each and keeps the lowest ``S``. A blank reference gives ``nll=None``.
* Length limit ``max_context_tokens`` (default: the model's ``max_position_embeddings``): when prompt
  plus answer is longer, the lowest-ranked chunks are dropped one at a time (the prompt is rendered
  again) until it fits; if the answer does not fit even with no chunk, its first tokens that fit are
  kept. Either way the score says ``truncated=True`` (and ``context_chunks`` how many chunks remained).

Computation (vLLM): the same sequences through ``prompt_logprobs`` of the answerer's engine
(:func:`memreader.core.vllm_engine.prompt_nlls`), in the engine's dtype.

Computation (transformers): forward passes of the model body only, under ``torch.inference_mode``; sequences sorted
by length, right-padded batches of ``batch_size`` (right padding leaves every real position exactly
as unpadded, for a causal LM); the LM head runs only on the hidden states that predict answer tokens,
``slice_tokens`` rows at a time, so no ``[batch, seq, vocab]`` tensor exists.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from memreader.core.errors import MemReaderError
from memreader.core.prompts import load_template
from memreader.eval.answering import answer_messages
from memreader.eval.records import SupportRecord

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

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return asdict(self)


def prompt_ids(tokenizer: Any, question: str, chunks: Sequence[str]) -> list[int]:
    """Token ids of the answering prompt (:func:`memreader.eval.answering.answer_messages`, the QA stage's own
    prompt) with the assistant turn opened, as :func:`memreader.core.generation.local.generate_chat_batch`
    tokenizes it."""
    text = tokenizer.apply_chat_template(answer_messages(question, chunks), add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _as_item(item: SupportItem | Mapping[str, Any]) -> SupportItem:
    if isinstance(item, SupportItem):
        return item
    if isinstance(item, Mapping):
        contexts = item.get("contexts", item.get("retrieved"))
        answers = item.get("answers", item.get("answer"))
        if "question" not in item or contexts is None or answers is None:
            raise SupportError(f"support item {dict(item)!r:.200} lacks question / contexts / answers",
                               "give SupportItem(question, contexts, answers) or a dict with those keys")
        contexts = [c["text"] if isinstance(c, Mapping) else c for c in contexts]
        return SupportItem(str(item["question"]), contexts, answers)
    raise SupportError(f"support item of type {type(item).__name__} is not a SupportItem or a mapping")


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


def _logits(model: Any, hidden: Any) -> Any:
    logits = model.get_output_embeddings()(hidden).float()
    scale = getattr(model.config, "logit_scale", None)
    if scale:
        logits = logits * scale
    softcap = getattr(model.config, "final_logit_softcapping", None)
    if softcap:
        logits = softcap * (logits / softcap).tanh()
    return logits


def sequence_nlls(model: Any, sequences: Sequence[tuple[list[int], int]], pad_id: int, batch_size: int = 8,
                  slice_tokens: int = 256) -> list[np.ndarray]:
    """Per-token ``-log p`` of ``ids[start:]`` for each ``(ids, start)`` (``start >= 1``), batched and
    right-padded; returns one float64 array per sequence, in input order."""
    import torch

    if batch_size < 1 or slice_tokens < 1:
        raise SupportError(f"batch_size={batch_size} and slice_tokens={slice_tokens} must be >= 1")
    body = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    device = next(model.parameters()).device
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i][0]), reverse=True)
    out: list[np.ndarray] = [np.empty(0)] * len(sequences)
    with torch.inference_mode():
        for lo in range(0, len(order), batch_size):
            idx = order[lo: lo + batch_size]
            width = len(sequences[idx[0]][0])
            ids = np.full((len(idx), width), pad_id, dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            rows, targets = [], []
            for r, i in enumerate(idx):
                seq, start = sequences[i]
                if start < 1 or start > len(seq):
                    raise SupportError(f"sequence {i}: scored span starts at {start}, outside 1..{len(seq)}")
                ids[r, : len(seq)], mask[r, : len(seq)] = seq, 1
                rows.append(r * width + np.arange(start - 1, len(seq) - 1))  # hidden at p-1 predicts token p
                targets.append(np.asarray(seq[start:], dtype=np.int64))
            hidden = body(input_ids=torch.from_numpy(ids).to(device), attention_mask=torch.from_numpy(mask).to(device),
                          use_cache=False).last_hidden_state
            flat = hidden.reshape(-1, hidden.shape[-1])
            index = torch.from_numpy(np.concatenate(rows)).to(device)
            target = torch.from_numpy(np.concatenate(targets)).to(device)
            values = torch.empty(index.shape[0], dtype=torch.float32, device=device)
            for s in range(0, index.shape[0], slice_tokens):
                e = min(s + slice_tokens, index.shape[0])
                logits = _logits(model, flat.index_select(0, index[s:e]))
                values[s:e] = torch.logsumexp(logits, -1) - logits.gather(1, target[s:e, None]).squeeze(1)
            flat_values = values.cpu().numpy().astype(np.float64)
            k = 0
            for i, t in zip(idx, targets, strict=True):
                out[i] = flat_values[k: k + len(t)]
                k += len(t)
    return out


def informational_support(model: Any, tokenizer: Any, items: Sequence[SupportItem | Mapping[str, Any]],
                          batch_size: int = 8, max_context_tokens: int | None = None, multi_ref: str = "first",
                          slice_tokens: int = 256) -> list[SupportScore]:
    """One :class:`SupportScore` per item (see the module docstring for the exact definition)."""
    if multi_ref not in MULTI_REF:
        raise SupportError(f"multi_ref={multi_ref!r} is not one of {', '.join(MULTI_REF)}")
    vllm_engine = hasattr(model, "llm") and hasattr(model, "max_model_len")  # a memreader.core.vllm_engine.Engine
    # vLLM needs one position past the prompt (it generates a token to return prompt log-probabilities)
    window = model.max_model_len - 1 if vllm_engine else getattr(model.config, "max_position_embeddings", None)
    limit = max_context_tokens if max_context_tokens is not None else (window or None)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    start = time.perf_counter()
    jobs: list[tuple[int, int, int, bool]] = []  # (item, reference index, chunks kept, truncated)
    sequences: list[tuple[list[int], int]] = []
    parsed = [_as_item(it) for it in items]
    for n, item in enumerate(parsed):
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
        nlls = sequence_nlls(model, sequences, int(pad if pad is not None else 0), batch_size, slice_tokens)
    best: dict[int, SupportScore] = {}
    for (n, ref_index, kept, truncated), values in zip(jobs, nlls, strict=True):
        score = SupportScore(float(values.mean()), len(values), truncated, kept, ref_index)
        if n not in best or score.nll < best[n].nll:  # type: ignore[operator]
            best[n] = score
    seconds = time.perf_counter() - start
    tokens = sum(len(s) for s, _ in sequences)
    log.info("support: %d items, %d sequences, %d tokens (%d answer tokens) in %.2f s = %.0f tokens/s",
             len(parsed), len(sequences), tokens, sum(len(v) for v in nlls), seconds, tokens / max(seconds, 1e-9))
    return [best.get(n, SupportScore(None, 0, False, len(parsed[n].contexts))) for n in range(len(parsed))]


def support_signature(model_name: str, multi_ref: str = "first", max_context_tokens: int | None = None,
                      dtype: str = "float32") -> str:
    """What a support score depends on besides the data (equal signatures: comparable numbers)."""
    templates = ",".join(load_template("qa_answer", lang).id for lang in ("en", "zh"))
    return (f"Support|model:{model_name}|tpl:{templates}|chat:assistant-open|answer:strip,no-eos|refs:{multi_ref}|"
            f"ctx:{max_context_tokens or 'model'}|drop:last-chunks|dtype:{dtype}|mr-support:{SUPPORT_VERSION}")


def support_summary(scores: Sequence[SupportScore], ids: Sequence[str], signature: str) -> dict[str, Any]:
    """The ``support`` entry of an evaluation summary (:class:`memreader.eval.records.SupportRecord`): per-example S, ids,
    mean over scored items."""
    if len(scores) != len(ids):
        raise SupportError(f"{len(scores)} support scores for {len(ids)} ids")
    return SupportRecord.of([s.nll for s in scores], ids, signature, sum(s.truncated for s in scores)).to_dict()


def support_for_answers(model_name_or_objects: Any, questions: Sequence[str], contexts: Sequence[Sequence[str]],
                        answers: Sequence[str | Sequence[str]], batch_size: int = 8,
                        max_context_tokens: int | None = None, multi_ref: str = "first") -> list[SupportScore]:
    """:func:`informational_support` from parallel lists. ``model_name_or_objects``: a registry name
    or folder (loaded with :func:`memreader.core.runtime.load_causal_lm`), a ``(model, tokenizer)`` pair,
    a :class:`memreader.core.generation.LocalChat` (its already-loaded model is reused), or a
    :class:`memreader.core.generation.vllm_chat.VLLMChat` (its engine's ``prompt_logprobs``)."""
    if not len(questions) == len(contexts) == len(answers):
        raise SupportError(f"{len(questions)} questions, {len(contexts)} contexts and {len(answers)} answers: "
                           "the three lists must align")
    if isinstance(model_name_or_objects, str):
        from memreader.core.runtime import load_causal_lm

        model, tokenizer = load_causal_lm(model_name_or_objects)
    elif isinstance(model_name_or_objects, tuple):
        model, tokenizer = model_name_or_objects
    elif hasattr(model_name_or_objects, "engine") and hasattr(model_name_or_objects.engine, "llm"):  # VLLMChat
        model, tokenizer = model_name_or_objects.engine, model_name_or_objects.tokenizer()
    elif hasattr(model_name_or_objects, "model") and hasattr(model_name_or_objects, "tokenizer"):
        model, tokenizer = model_name_or_objects.model(), model_name_or_objects.tokenizer()
    else:
        raise SupportError(f"cannot get a model from {type(model_name_or_objects).__name__}",
                           "pass a model name, a (model, tokenizer) pair, a LocalChat or a VLLMChat")
    items = [SupportItem(q, c, a) for q, c, a in zip(questions, contexts, answers, strict=True)]
    return informational_support(model, tokenizer, items, batch_size, max_context_tokens, multi_ref)
