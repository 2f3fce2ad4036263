"""The forward-pass machinery of the evaluator scorer (:mod:`memreader.core.scoring`): requests (token sequences with
the positions whose NLL, or whose next-token answer-word probabilities, are wanted; a sequence that is a prefix of
another is merged into it), computed by :class:`HFEngine` (:class:`TokenNLL`, the project's one transformers token
NLL, which informational support and the query-likelihood verifier call too) or :class:`VLLMEngine`; and
:func:`sigmoid`, which turns a log-odds into a score.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
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
        if key not in self.reqs:
            self.reqs[key] = _Req(key)
        return self.reqs[key]

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
# The transformers token NLL (the evaluator scorer's HFEngine, informational support, the query-likelihood
# verifier), and the logistic function that turns a log-odds into a score.


def sigmoid(z: float) -> float:
    """The logistic function ``1 / (1 + e^-z)``, overflow-safe for large ``|z|``: a log-odds as a probability (the
    evaluator's ``ppl`` boundary score, a MeVe verifier's score)."""
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


class TokenNLL:
    """``-log P(token | the tokens before it)`` from a transformers causal LM, in fp32: the project's one
    transformers token NLL (the vLLM twins: :class:`VLLMEngine`, :func:`memreader.core.vllm_engine.prompt_nlls`).

    Sequences are sorted longest first and right-padded into batches of at most ``batch_size`` rows and
    ``max_batch_tokens`` padded tokens (a longer sequence runs alone), a batch closing early when
    padding would pass ``max_pad_fraction`` of it; right padding leaves every real position as it is unpadded, for
    a causal LM. Only the model body runs on the batch; the LM head (times the config's ``logit_scale``, then its
    ``final_logit_softcapping``, as the model's own forward does) runs on the hidden states of the scored positions
    alone, ``slice_tokens`` rows at a time, so no ``[batch, seq, vocab]`` tensor exists. Counters:
    ``tokens_processed`` (real tokens through the body), ``padded_tokens`` (rows × width), ``batches``,
    ``max_width`` (the longest sequence seen)."""

    def __init__(self, model: Any, tokenizer: Any, *, batch_size: int | None = None,
                 max_batch_tokens: int | None = None, max_pad_fraction: float = 1.0, slice_tokens: int = 256) -> None:
        limits = {"batch_size": batch_size, "max_batch_tokens": max_batch_tokens, "slice_tokens": slice_tokens}
        bad = [f"{k}={v}" for k, v in limits.items() if v is not None and v < 1]
        bad += [] if 0.0 <= max_pad_fraction <= 1.0 else [f"max_pad_fraction={max_pad_fraction}"]
        if bad:
            raise ValueError(f"token NLL settings out of range: {', '.join(bad)} — fix: batch sizes and slices are "
                             ">= 1, max_pad_fraction is in [0, 1]")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.model, self.tokenizer = model, tokenizer
        self.pad_id = int(pad if pad is not None else 0)  # right padding: never read by a scored position
        self.max_rows, self.max_tokens = batch_size or math.inf, max_batch_tokens or math.inf
        self.max_pad_fraction, self.slice_tokens = max_pad_fraction, slice_tokens
        self.body = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        self.head = model.get_output_embeddings()
        self.device = next(model.parameters()).device
        self.logit_scale = getattr(model.config, "logit_scale", None)
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        self.tokens_processed = self.padded_tokens = self.batches = self.max_width = 0

    def logits(self, hidden: Any) -> Any:
        """fp32 next-token logits of hidden states, scaled and soft-capped as the model's forward does."""
        logits = self.head(hidden).float()
        if self.logit_scale:
            logits = logits * self.logit_scale
        if self.softcap:
            logits = self.softcap * (logits / self.softcap).tanh()
        return logits

    def nlls(self, sequences: Sequence[Sequence[int]], positions: Sequence[Sequence[int]],
             tokens: Sequence[Sequence[int]] | None = None) -> list[np.ndarray]:
        """``out[i][j] = -log P(tokens[i][j] | sequences[i][:positions[i][j]])`` (float64, one array per sequence,
        in input order). ``tokens`` default to the sequences' own tokens at those positions (``1 <= p < len``);
        given tokens may also sit just past the sequence (``p = len``: the NLL of a token that would follow it)."""
        import torch

        pos = [np.asarray(p, dtype=np.int64) for p in positions]
        for i, (seq, p) in enumerate(zip(sequences, pos, strict=True)):
            top = len(seq) - (tokens is None)
            if len(p) and (p.min() < 1 or p.max() > top):
                raise ValueError(f"sequence {i}: scored positions {p.min()}..{p.max()} are outside 1..{top}")
        if tokens is None:
            tokens = [np.asarray(seq, dtype=np.int64)[p] for seq, p in zip(sequences, pos, strict=True)]
        out = [np.zeros(0)] * len(sequences)
        order = sorted((i for i in range(len(sequences)) if len(pos[i])), key=lambda i: len(sequences[i]),
                       reverse=True)
        with torch.inference_mode():
            for batch in self._batches([len(sequences[i]) for i in order]):
                rows = [order[b] for b in batch]
                values = self._batch([sequences[i] for i in rows], [pos[i] for i in rows], [tokens[i] for i in rows])
                for i, v in zip(rows, values, strict=True):
                    out[i] = v
        return out

    def _batches(self, lengths: list[int]) -> Iterator[range]:
        """Consecutive index ranges of the longest-first ``lengths`` within the batch limits."""
        i = 0
        while i < len(lengths):
            width = real = lengths[i]
            n = 1
            while i + n < len(lengths) and n < self.max_rows and (n + 1) * width <= self.max_tokens:
                if real + lengths[i + n] < (1.0 - self.max_pad_fraction) * (n + 1) * width:
                    break
                real, n = real + lengths[i + n], n + 1
            yield range(i, i + n)
            i += n

    def _batch(self, seqs: list[Sequence[int]], pos: list[np.ndarray], tokens: list[Any]) -> list[np.ndarray]:
        import torch

        rows, width = len(seqs), len(seqs[0])
        ids = np.full((rows, width), self.pad_id, dtype=np.int64)
        mask = np.zeros((rows, width), dtype=np.int64)
        for r, seq in enumerate(seqs):
            ids[r, : len(seq)], mask[r, : len(seq)] = seq, 1
        attention = torch.from_numpy(mask).to(self.device) if not mask.all() else None
        hidden = self.body(input_ids=torch.from_numpy(ids).to(self.device), attention_mask=attention,
                           use_cache=False).last_hidden_state
        self.tokens_processed += int(mask.sum())
        self.padded_tokens += rows * width
        self.batches += 1
        self.max_width = max(self.max_width, width)
        flat = hidden.reshape(rows * width, hidden.shape[-1])
        # the hidden state at p - 1 predicts the token at p
        index = torch.from_numpy(np.concatenate([r * width + p - 1 for r, p in enumerate(pos)])).to(self.device)
        target = torch.from_numpy(np.concatenate([np.asarray(t, dtype=np.int64) for t in tokens])).to(self.device)
        values = torch.empty(index.shape[0], dtype=torch.float32, device=self.device)
        for s in range(0, index.shape[0], self.slice_tokens):
            e = min(s + self.slice_tokens, index.shape[0])
            logits = self.logits(flat.index_select(0, index[s:e]))
            values[s:e] = torch.logsumexp(logits, -1) - logits.gather(1, target[s:e, None]).squeeze(1)
            del logits
        return np.split(values.cpu().numpy().astype(np.float64), np.cumsum([len(p) for p in pos])[:-1])


# ---------------------------------------------------------------------------------------------
# Engines: compute the NLLs and answer probabilities of physical requests.


class HFEngine(TokenNLL):
    """The requests' NLLs and answer probabilities through :class:`TokenNLL` (batches of ``max_batch_tokens`` padded
    tokens, at most ``max_pad_fraction`` padding)."""

    def __init__(self, model: Any, tokenizer: Any, max_batch_tokens: int, slice_tokens: int,
                 max_pad_fraction: float = 0.1) -> None:
        super().__init__(model, tokenizer, max_batch_tokens=max_batch_tokens, max_pad_fraction=max_pad_fraction,
                         slice_tokens=slice_tokens)

    def run(self, reqs: list[_Req], answer_ids: list[int] | None) -> None:
        """Fill ``req.nll`` and ``req.ans`` of every request: the answer-word probabilities at ``q`` are
        ``exp(-NLL)`` of each answer word as the token after ``ids[:q+1]``."""
        words = np.asarray(answer_ids or [], dtype=np.int64)
        asked = [(req.positions(), np.array(sorted(req.ans_pos), dtype=np.int64)) for req in reqs]
        assert len(words) or not any(len(ans) for _, ans in asked), "answer positions asked without answer ids"
        positions = [np.concatenate([pos, np.repeat(ans + 1, len(words))]) for pos, ans in asked]
        tokens = [np.concatenate([np.asarray(req.ids, dtype=np.int64)[pos], np.tile(words, len(ans))])
                  for req, (pos, ans) in zip(reqs, asked, strict=True)]
        for req, (pos, ans), values in zip(reqs, asked, self.nlls([r.ids for r in reqs], positions, tokens),
                                           strict=True):
            if len(pos):
                req.nll = np.full(len(req.ids), np.nan)
                req.nll[pos] = values[: len(pos)]
            for q, row in zip(ans.tolist(), np.exp(-values[len(pos):]).reshape(len(ans), len(words)), strict=True):
                req.ans[q] = (float(row[0]), float(row[1]))


class VLLMEngine:
    """The same quantities through vLLM's ``prompt_logprobs`` (``vllm >= 0.12``), on the process's shared engine
    (:func:`memreader.core.vllm_engine.get_engine`). The answer-word probabilities at ``q`` come from the prompts
    ``ids[:q+1] + [answer_id]``, one per answer word (computed twice where prefix caching does not serve prompt
    log-probabilities). vLLM takes them from the raw logits over the full vocabulary, in the model's dtype, and
    batches all requests of one ``generate`` call itself (no padding).
    """

    def __init__(self, model: str, dtype: str = "auto", max_model_len: int = 8192, engine: Any = None,
                 **spec_kw: Any) -> None:
        from memreader.core.vllm_engine import EngineSpec, get_engine

        self.engine = engine or get_engine(EngineSpec(model=model, dtype=dtype, max_model_len=max_model_len, **spec_kw))
        self.llm = self.engine.llm
        self.tokenizer = self.engine.tokenizer()
        self.dtype = self.engine.dtype
        self.tokens_processed = self.padded_tokens = self.batches = 0  # vLLM packs sequences: no padding

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
        from vllm import SamplingParams

        # one generated token (required), and the log-probability of every actual prompt token
        outs = self.llm.generate(prompts, SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False,
                                 lora_request=self.engine.lora)
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
