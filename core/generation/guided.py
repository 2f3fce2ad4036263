"""Grammar-constrained decoding for transformers ``generate``, driven by llguidance.

    processor = GuidedLogitsProcessor(tokenizer, [lark_a, None, lark_b], eos_ids)
    model.generate(**enc, logits_processor=LogitsProcessorList([processor]))

One matcher per batch row (``None`` leaves a row free); details: docs/ARCHITECTURE.md (Guided decoding: Enforcement).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from memreader.core.errors import MemReaderError

_LL_TOKENIZERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


class GuidedDecodingUnavailable(MemReaderError, RuntimeError):
    """Guided decoding was asked for but cannot run here (message: problem and fix)."""


def llguidance_module() -> Any:
    """The ``llguidance`` package, or an error naming the fix."""
    try:
        import llguidance
        import llguidance.hf  # noqa: F401  (the submodule is what wraps HF tokenizers)
    except ImportError as exc:
        raise GuidedDecodingUnavailable(
            "guided decoding needs the llguidance package, which is not installed — fix: pip install llguidance "
            "(it is a core dependency: reinstall with `pip install -e .`), or set guided=off") from exc
    return llguidance


def ll_tokenizer(tokenizer: Any) -> Any:
    """llguidance's view of a Hugging Face fast tokenizer (built once per tokenizer, ~0.3 s)."""
    cached = _LL_TOKENIZERS.get(tokenizer)
    if cached is not None:
        return cached
    llg = llguidance_module()
    if not getattr(tokenizer, "is_fast", False):
        raise GuidedDecodingUnavailable(
            f"guided decoding needs a fast (Rust) tokenizer, but {type(tokenizer).__name__} is a slow one — fix: "
            "save the model with a tokenizer.json (AutoTokenizer.from_pretrained(..., use_fast=True)), or set "
            "guided=off")
    ll_tok = llg.hf.from_tokenizer(tokenizer)
    _LL_TOKENIZERS[tokenizer] = ll_tok
    return ll_tok


def compile_matcher(ll_tok: Any, grammar: str) -> Any:
    """A fresh matcher for ``grammar``; a grammar llguidance rejects raises with its message."""
    llg = llguidance_module()
    matcher = llg.LLMatcher(ll_tok, grammar, log_level=0)
    if matcher.is_error():
        raise ValueError(f"llguidance rejected the grammar: {matcher.get_error()}")
    return matcher


class GuidedLogitsProcessor:
    """A transformers logits processor that keeps each batch row inside its own grammar."""

    def __init__(self, tokenizer: Any, grammars: Sequence[str | None], eos_ids: Sequence[int]) -> None:
        self.ll_tok = ll_tokenizer(tokenizer)
        llg = llguidance_module()
        self.matchers = [compile_matcher(self.ll_tok, g) if g is not None else None for g in grammars]
        self.eos_ids = set(eos_ids)
        self.finished = [False] * len(grammars)
        self._executor = llg.LLExecutor()
        self._bitmask = np.full((len(grammars), (self.ll_tok.vocab_size + 31) // 32), -1, dtype=np.int32)
        self._prompt_len: int | None = None

    def complete(self, row: int) -> bool:
        """Whether row ``row``'s grammar accepted its output (always True for a free row)."""
        m = self.matchers[row]
        return m is None or m.is_accepting()

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import llguidance.torch as llt
        import torch

        if self._prompt_len is None:
            self._prompt_len = input_ids.shape[1]
        elif input_ids.shape[1] > self._prompt_len:
            last = input_ids[:, -1].tolist()
            for row, (m, tok) in enumerate(zip(self.matchers, last, strict=True)):
                if m is None or self.finished[row]:
                    continue
                if tok in self.eos_ids and m.is_accepting():
                    self.finished[row] = True
                    continue
                if not m.consume_token(tok):
                    raise RuntimeError(f"guided row {row}: the grammar refused token {tok} it had allowed "
                                       f"({m.get_error()}); this is a bug in the mask application")
        rows = [(m, i) for i, m in enumerate(self.matchers) if m is not None and not self.finished[i]]
        if not rows:
            return scores
        bitmask = torch.from_numpy(self._bitmask)
        llt.fill_next_token_bitmask_par(self._executor, rows, bitmask)
        allowed = np.unpackbits(self._bitmask.view(np.uint8), axis=1, bitorder="little").astype(bool)
        vocab = scores.shape[1]
        if allowed.shape[1] < vocab:  # embedding rows past the tokenizer's vocabulary are never allowed
            allowed = np.pad(allowed, ((0, 0), (0, vocab - allowed.shape[1])))
        allowed = torch.from_numpy(allowed[:, :vocab]).to(scores.device)
        for _, i in rows:
            scores[i].masked_fill_(~allowed[i], float("-inf"))
        return scores
