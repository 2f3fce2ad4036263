"""Tokenizers for the answer metrics (``jieba``, ``char``, ``whitespace``, ``13a``), each named and versioned so
that signatures can record them; :func:`postprocess` applies the whitespace and case options
(:class:`memreader.eval.metrics.MetricConfig`). Details: docs/EVALUATION.md (Tokens).
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable
from functools import cache

TOKENIZERS = ("jieba", "char", "whitespace", "13a")


@cache
def init_jieba() -> None:
    """Load jieba's dictionary once per process and silence its start-up chatter."""
    import jieba

    jieba.setLogLevel(logging.WARNING)
    jieba.initialize()


def _jieba_tokens(text: str) -> list[str]:
    import jieba

    init_jieba()
    return list(jieba.cut(text))


@cache
def _tokenizer_13a() -> Callable[[str], str]:
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    return Tokenizer13a()


_FUNCTIONS: dict[str, Callable[[str], list[str]]] = {
    "jieba": _jieba_tokens,
    "char": list,
    "whitespace": str.split,
    "13a": lambda text: _tokenizer_13a()(text).split(),
}


def get_tokenizer(name: str) -> Callable[[str], list[str]]:
    """The tokenizer called ``name`` (one of :data:`TOKENIZERS`)."""
    try:
        return _FUNCTIONS[name]
    except KeyError:
        raise ValueError(f"unknown tokenizer {name!r}; choose one of {', '.join(TOKENIZERS)}") from None


def tokenize(text: str, name: str) -> list[str]:
    """Raw tokens of ``text`` (no case folding, whitespace tokens kept where the tokenizer makes them)."""
    if not isinstance(text, str):
        raise TypeError(f"expected a string to tokenize, got {type(text).__name__}: {text!r:.80}")
    return get_tokenizer(name)(text)


def postprocess(tokens: list[str], keep_whitespace: bool, lowercase: bool) -> list[str]:
    """Apply the recorded token options.

    Dropping whitespace is ``' '.join(tokens).split()``, literally what the MoM METEOR cell does,
    so a token that merely contains whitespace is split exactly as it was there.
    """
    out = tokens if keep_whitespace else " ".join(tokens).split()
    return [t.lower() for t in out] if lowercase else list(out)


@cache
def tokenizer_signature(name: str) -> str:
    """``name`` plus the version of the library behind it, e.g. ``jieba-0.42.1``."""
    get_tokenizer(name)
    if name == "jieba":
        return f"jieba-{importlib.metadata.version('jieba')}"
    if name == "13a":
        return f"13a-sacrebleu-{importlib.metadata.version('sacrebleu')}"
    return name
