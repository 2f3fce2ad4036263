"""The forward-pass machinery of the evaluator scorer (:mod:`memreader.core.scoring`).

Requests are token sequences with the positions whose NLL is wanted (and positions whose next-token
distribution gives the answer-word probabilities); a sequence that is a prefix of another is merged
into it. :class:`HFEngine` runs them through a transformers causal LM in length-sorted, padded
batches and applies the LM head only to the scored positions, ``slice_tokens`` rows at a time;
:class:`VLLMEngine` computes the same quantities through vLLM ``prompt_logprobs`` (CPU build or GPU).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

# ---------------------------------------------------------------------------------------------
# Requests: token sequences with the positions to score, merged when one is a prefix of another.


class _Req:
    """One token sequence: ``spans`` = ``[start, end)`` ranges of positions ``p`` whose token's NLL given
    ``ids[:p]`` is wanted (``start >= 1``), ``ans_pos`` = positions whose hidden state gives the
    answer-word probabilities of the next token. Results: ``nll[p]`` (NaN where not scored), ``ans[q]``."""

    __slots__ = ("ids", "spans", "ans_pos", "phys", "nll", "ans")

    def __init__(self, ids: tuple[int, ...]) -> None:
        self.ids = ids
        self.spans: list[tuple[int, int]] = []
        self.ans_pos: set[int] = set()
        self.phys: _Req = self
        self.nll: np.ndarray | None = None
        self.ans: dict[int, tuple[float, float]] = {}

    def positions(self) -> np.ndarray:
        """Sorted distinct positions to score."""
        mask = np.zeros(len(self.ids), dtype=bool)
        for start, end in self.spans:
            mask[start:end] = True
        return np.flatnonzero(mask)


class _Pool:
    """All requests of one scoring call."""

    def __init__(self) -> None:
        self.reqs: dict[tuple[int, ...], _Req] = {}

    def get(self, ids: Sequence[int]) -> _Req:
        key = tuple(ids)
        req = self.reqs.get(key)
        if req is None:
            req = self.reqs[key] = _Req(key)
        return req

    def span(self, ids: Sequence[int], start: int, end: int) -> tuple[_Req, int, int]:
        """Ask for the NLL of ``ids[start:end]`` (positions < 1 cannot be scored and are dropped)."""
        req = self.get(ids)
        start = max(start, 1)
        if start < end:
            req.spans.append((start, end))
        return req, start, end

    def answer(self, ids: Sequence[int]) -> _Req:
        """Ask for the answer-word probabilities after the whole of ``ids``."""
        req = self.get(ids)
        req.ans_pos.add(len(ids) - 1)
        return req

    def physical(self) -> list[_Req]:
        """Merge every sequence that is a prefix of another into the longer one; the sequences left."""
        keys = sorted(self.reqs)
        out: list[_Req] = []
        target: _Req | None = None
        # All sequences that extend ``k`` follow it directly in lexicographic order, so the next key
        # extends ``k`` iff any does; walk backwards carrying the longest extension of the chain.
        for i in range(len(keys) - 1, -1, -1):
            req = self.reqs[keys[i]]
            nxt = keys[i + 1] if i + 1 < len(keys) else None
            if nxt is not None and target is not None and nxt[: len(req.ids)] == req.ids:
                req.phys = target
                target.spans += req.spans
                target.ans_pos |= req.ans_pos
            else:
                req.phys = target = req
                out.append(req)
        return out


def _span_nll(handle: tuple[_Req, int, int]) -> np.ndarray:
    req, start, end = handle
    if start >= end:
        return np.zeros(0)
    assert req.phys.nll is not None
    return req.phys.nll[start:end]


# ---------------------------------------------------------------------------------------------
# Engines: compute the NLLs and answer probabilities of physical requests.


class HFEngine:
    """Batched forward passes of a transformers causal LM (see the module docstring)."""

    def __init__(self, model: Any, tokenizer: Any, max_batch_tokens: int, slice_tokens: int,
                 max_pad_fraction: float = 0.1) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.max_batch_tokens, self.slice_tokens = max_batch_tokens, slice_tokens
        self.max_pad_fraction = max_pad_fraction
        self.body = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        self.head = model.get_output_embeddings()
        self.device = next(model.parameters()).device
        config = model.config
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self.logit_scale = getattr(config, "logit_scale", None)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = int(pad if pad is not None else 0)
        self.tokens_processed = 0  # real (unpadded) tokens through the model body
        self.padded_tokens = 0  # batch rows × width, padding included
        self.batches = 0
        self.max_width = 0  # longest sequence seen

    def _logits(self, hidden: Any) -> Any:
        logits = self.head(hidden).float()
        if self.logit_scale:
            logits = logits * self.logit_scale
        if self.softcap:
            logits = self.softcap * (logits / self.softcap).tanh()
        return logits

    def run(self, reqs: list[_Req], answer_ids: list[int] | None) -> None:
        """Fill ``req.nll`` and ``req.ans`` of every request (longest first, packed by padded tokens)."""
        import torch

        order = sorted(reqs, key=lambda r: len(r.ids), reverse=True)
        with torch.inference_mode():
            i = 0
            while i < len(order):
                width, real, n = len(order[i].ids), len(order[i].ids), 1
                # Grow the batch while it fits the token budget and padding stays under max_pad_fraction.
                while i + n < len(order) and (n + 1) * width <= self.max_batch_tokens:
                    nxt = len(order[i + n].ids)
                    if real + nxt < (1.0 - self.max_pad_fraction) * (n + 1) * width:
                        break
                    real, n = real + nxt, n + 1
                self._batch(order[i : i + n], width, answer_ids)
                i += n

    def _batch(self, batch: list[_Req], width: int, answer_ids: list[int] | None) -> None:
        import torch

        rows = len(batch)
        ids = np.full((rows, width), self.pad_id, dtype=np.int64)
        for r, req in enumerate(batch):
            ids[r, : len(req.ids)] = req.ids
        input_ids = torch.from_numpy(ids).to(self.device)
        mask = None
        if any(len(req.ids) != width for req in batch):
            mask_np = np.zeros((rows, width), dtype=np.int64)
            for r, req in enumerate(batch):
                mask_np[r, : len(req.ids)] = 1
            mask = torch.from_numpy(mask_np).to(self.device)
        hidden = self.body(input_ids=input_ids, attention_mask=mask, use_cache=False).last_hidden_state
        self.tokens_processed += sum(len(req.ids) for req in batch)
        self.padded_tokens += rows * width
        self.batches += 1
        self.max_width = max(self.max_width, width)
        flat = hidden.reshape(rows * width, hidden.shape[-1])

        # NLL rows: hidden state at p-1 predicts token p.
        where: list[tuple[_Req, np.ndarray]] = []
        rows_idx, targets = [], []
        for r, req in enumerate(batch):
            if req.spans:
                pos = req.positions()
                where.append((req, pos))
                rows_idx.append(r * width + pos - 1)
                targets.append(ids[r, pos])
        if rows_idx:
            index = torch.from_numpy(np.concatenate(rows_idx)).to(self.device)
            target = torch.from_numpy(np.concatenate(targets)).to(self.device)
            out = torch.empty(index.shape[0], dtype=torch.float32, device=self.device)
            for s in range(0, index.shape[0], self.slice_tokens):
                e = min(s + self.slice_tokens, index.shape[0])
                logits = self._logits(flat.index_select(0, index[s:e]))
                out[s:e] = torch.logsumexp(logits, -1) - logits.gather(1, target[s:e, None]).squeeze(1)
                del logits
            values = out.cpu().numpy().astype(np.float64)
            k = 0
            for req, pos in where:
                req.nll = np.full(len(req.ids), np.nan)
                req.nll[pos] = values[k : k + len(pos)]
                k += len(pos)

        # Answer rows: the full next-token distribution at the position, two probabilities kept.
        ans_rows = [(req, r * width + q) for r, req in enumerate(batch) for q in sorted(req.ans_pos)]
        if ans_rows:
            assert answer_ids is not None
            index = torch.tensor([x for _, x in ans_rows], device=self.device)
            cols = torch.tensor(answer_ids, device=self.device)
            probs = []
            for s in range(0, index.shape[0], self.slice_tokens):
                logits = self._logits(flat.index_select(0, index[s : s + self.slice_tokens]))
                probs.append(torch.log_softmax(logits, -1)[:, cols].exp())
            p = torch.cat(probs).cpu().numpy().astype(np.float64)
            for (req, x), row in zip(ans_rows, p, strict=True):
                req.ans[x % width] = (float(row[0]), float(row[1]))


class VLLMEngine:
    """The same quantities through vLLM (``vllm >= 0.12``; its CPU build here), on the process's shared engine.

    NLLs come from ``SamplingParams(max_tokens=1, prompt_logprobs=0)``: ``output.prompt_logprobs[p]``
    is a dict that holds the log-probability of the actual prompt token ``p`` (index 0 is ``None``).
    The answer-word probabilities at position ``q`` are read the same way, from the prompts
    ``ids[:q+1] + [answer_id]`` (one per answer word; where vLLM's prefix caching serves prompt
    log-probabilities, the two share their prefix, else the prompt is computed twice).
    vLLM computes these log-probabilities from the raw logits over the full vocabulary (its default
    ``logprobs_mode``), in the model's dtype; all requests go to one ``generate`` call, and vLLM does
    the batching (no padding). The engine is :func:`memreader.core.vllm_engine.get_engine`'s: started once per
    process and shared with the other stages that use the same model.
    """

    def __init__(self, model: str, dtype: str = "auto", max_model_len: int = 8192, engine: Any = None,
                 **spec_kw: Any) -> None:
        from memreader.core.vllm_engine import EngineSpec, get_engine

        self.engine = engine or get_engine(EngineSpec(model=model, dtype=dtype, max_model_len=max_model_len, **spec_kw))
        self.llm = self.engine.llm
        self.tokenizer = self.engine.tokenizer()
        self.dtype = self.engine.dtype
        self.tokens_processed = 0
        self.padded_tokens = 0  # vLLM packs sequences: no padding
        self.batches = 0

    @staticmethod
    def sampling_params() -> Any:
        """One generated token (required), and the log-probability of every actual prompt token."""
        from vllm import SamplingParams

        return SamplingParams(max_tokens=1, prompt_logprobs=0)

    def run(self, reqs: list[_Req], answer_ids: list[int] | None) -> None:
        prompts: list[dict[str, list[int]]] = []
        jobs: list[tuple[_Req, int, int]] = []  # (request, answer position or -1 for the NLLs, answer index)
        for req in reqs:
            if req.spans:
                prompts.append({"prompt_token_ids": list(req.ids)})
                jobs.append((req, -1, 0))
            for q in sorted(req.ans_pos):
                for k, tok in enumerate(answer_ids or ()):
                    prompts.append({"prompt_token_ids": [*req.ids[: q + 1], tok]})
                    jobs.append((req, q, k))
        if not prompts:
            return
        outs = self.llm.generate(prompts, self.sampling_params(), use_tqdm=False, lora_request=self.engine.lora)
        self.tokens_processed += sum(len(p["prompt_token_ids"]) for p in prompts)
        self.batches += 1
        answers: dict[tuple[int, int], list[float]] = {}
        for (req, q, k), out, prompt in zip(jobs, outs, prompts, strict=True):
            ids = prompt["prompt_token_ids"]
            if q < 0:
                req.nll = np.full(len(ids), np.nan)
                for p in req.positions().tolist():
                    req.nll[p] = -float(out.prompt_logprobs[p][ids[p]].logprob)
            else:
                got = answers.setdefault((id(req), q), [0.0, 0.0])
                got[k] = math.exp(float(out.prompt_logprobs[-1][ids[-1]].logprob))
                req.ans[q] = (got[0], got[1])
