"""Token counts in an answering model's tokenizer, for context budgets (MeVe's ``t_max``, momentary contexts).

    counter = TokenCounter.load("smollm2-135m-instruct")     # or TokenCounter(tokenizer)
    counter.count("one text")                                 # exact, no special tokens
    counter.counts(passages)                                  # batched, remembered per tokenizer

A fast (Rust) tokenizer is counted through a private copy of its backend: the same vocabulary, merges,
normaliser and pre-tokeniser, with truncation and padding off and special tokens treated as the tokenizer
treats them, so the counts equal ``len(tokenizer(text, add_special_tokens=False)["input_ids"])`` (tested) while
skipping the Python around that call. The copy also makes counting thread-safe: a transformers tokenizer
re-configures its backend on every call, so two threads sharing it can collide (MeVe counts passages in a worker
thread beside the verifier). A slow (Python) tokenizer is called as it is, under a lock.
"""

from __future__ import annotations

import hashlib
import json
import threading
import weakref
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from memreader.core.registry import resolve_model

__all__ = ["TokenCounter", "load_tokenizer"]

_CACHE_LIMIT = 200_000
"""Texts whose counts :meth:`TokenCounter.counts` keeps per tokenizer (cleared beyond that)."""
_RECENT_LIMIT = 4096
"""Texts whose :meth:`TokenCounter.count` each counter remembers (cleared beyond that)."""
_KNOWN: dict[str, dict[str, int]] = {}
"""Counts per tokenizer definition (see :func:`_private_backend`)."""
_KNOWN_LOCK = threading.Lock()


_COPIES: weakref.WeakKeyDictionary[Any, tuple[Any, str]] = weakref.WeakKeyDictionary()
"""The private copy per tokenizer object, with the key its counts are kept under: making one parses the whole
tokenizer (a 49k vocabulary) through JSON, and MeVe builds a pipeline per question in `memreader ask`."""


@lru_cache(maxsize=4)
def load_tokenizer(name: str) -> Any:
    """The tokenizer of a model by registry name, folder or hub id (cached: one per model per process)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model(name))


def _private_backend(tokenizer: Any) -> tuple[Any, str] | None:
    """A copy of a fast tokenizer's Rust backend that only counts, and its count key: the hash of its whole
    definition and how it treats special tokens (so two tokenizers share counts only when they count alike).
    None for a slow tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "encode_batch_fast"):
        return None
    with _KNOWN_LOCK:
        made = _COPIES.get(tokenizer)
        if made is None:
            from tokenizers import Tokenizer

            definition = backend.to_str()
            split = bool(getattr(tokenizer, "split_special_tokens", False))
            own = Tokenizer.from_str(definition)
            own.no_truncation()
            own.no_padding()
            own.encode_special_tokens = split
            made = _COPIES[tokenizer] = (own, f"{hashlib.sha256(definition.encode()).hexdigest()[:16]}|split:{split}")
    return made


def _joins_add_up(backend: Any) -> bool:
    """Whether texts joined by whitespace count as the sum of their parts plus the whitespace's tokens, wherever
    the parts neither start nor end with whitespace nor hold an added token: a byte-level BPE with GPT-2's
    pre-tokenising pattern, no normaliser and no added token that holds whitespace. Its pattern never lets a piece
    cross from a non-space character into whitespace (letters, digits, punctuation and contractions each exclude
    it), a run of whitespace between two non-space characters splits the same way whatever they are (its last
    character alone, the rest before it), and BPE merges stay inside a piece. Qwen2.5's and Llama 3's patterns glue punctuation to the
    newlines after it, so they are counted in full."""
    spec = json.loads(backend.to_str())
    pre = spec.get("pre_tokenizer") or {}
    added = [t.get("content", "") for t in spec.get("added_tokens") or []]
    return (spec.get("normalizer") is None and (spec.get("model") or {}).get("type") == "BPE"
            and pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space")
            and not any(any(c.isspace() for c in t) for t in added))


class TokenCounter:
    """Counts tokens with a transformers tokenizer (no special tokens), safely from several threads."""

    def __init__(self, tokenizer: Any, name: str = "") -> None:
        self.tokenizer = tokenizer
        self.name = name or str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
        made = _private_backend(tokenizer)
        self._backend = made[0] if made else None
        self._lock = threading.Lock()  # only for a slow tokenizer, which is called as it is
        self._recent: dict[str, int] = {}  # count()'s last texts (one thread's dict writes are atomic in CPython)
        # one table per tokenizer definition in this process: a passage is counted once, not once per question or
        # per pipeline (a slow tokenizer's counts stay with this counter)
        with _KNOWN_LOCK:
            self._known = _KNOWN.setdefault(made[1], {}) if made else {}
        self.key: str | None = made[1] if made else None
        self._joins_add_up = _joins_add_up(made[0]) if made else False
        # an added token (<|im_end|>) cuts the text into segments pre-tokenised apart, so whitespace beside it
        # splits otherwise: a part that holds one is counted in full
        self._added = tuple(t.content for t in made[0].get_added_tokens_decoder().values()) if made else ()
        """What counts alike share (the hash of the tokenizer's whole definition and its special-token handling); None
        for a slow tokenizer. A passage store's counts are used when their key is this one."""

    @classmethod
    def load(cls, model: str) -> TokenCounter:
        """The tokenizer of a registry name (``smollm2-135m-instruct``), local folder or hub id."""
        return cls(load_tokenizer(model), name=model)

    def _lengths(self, texts: Sequence[str]) -> list[int]:
        if self._backend is not None:
            return [len(e.ids) for e in self._backend.encode_batch_fast(list(texts), add_special_tokens=False)]
        with self._lock:
            return [len(ids) for ids in self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]]

    def count(self, text: str) -> int:
        """Tokens of ``text`` (the last few thousand are remembered by this counter: a calibration packs the same
        contexts again and again, a query's joined context rarely repeats)."""
        n = self._recent.get(text)
        if n is None:
            n = self._lengths([text])[0]
            if len(self._recent) >= _RECENT_LIMIT:
                self._recent.clear()
            self._recent[text] = n
        return n

    def join_count(self, texts: Sequence[str], counts: Sequence[int], separator: str, separator_tokens: int
                   ) -> int | None:
        """The exact tokens of ``separator.join(texts)`` from the parts' ``counts``, without tokenising the join, where
        that is provably the sum (see :func:`_joins_add_up`; ``separator_tokens``: what the separator adds between two
        non-space characters); None where it is not (another tokenizer, a non-whitespace separator, a part that
        starts or ends with whitespace or holds an added token such as ``<|im_end|>``, an empty part): count the join
        then."""
        if not self._joins_add_up or not separator or not separator.isspace() or not texts:
            return None
        if any(not t or t[0].isspace() or t[-1].isspace() or any(a in t for a in self._added) for t in texts):
            return None
        return sum(counts) + separator_tokens * (len(texts) - 1)

    def counts(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text; texts counted before (by any counter of this tokenizer) are not tokenised again."""
        with _KNOWN_LOCK:
            have = {t: self._known[t] for t in texts if t in self._known}
        todo = [t for t in dict.fromkeys(texts) if t not in have]
        if todo:
            fresh = dict(zip(todo, self._lengths(todo), strict=True))
            have.update(fresh)
            with _KNOWN_LOCK:
                if len(self._known) + len(fresh) > _CACHE_LIMIT:
                    self._known.clear()
                self._known.update(fresh)
        return [have[t] for t in texts]
