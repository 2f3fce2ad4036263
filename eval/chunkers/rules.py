"""Rule-based chunkers: fixed length, and sentence-aware packing (LlamaIndex SentenceSplitter style).

- ``fixed``: consecutive ``chunk_chars``-character spans, sentence ends ignored (the paper's
  "Original"). Written by hand: it is one slice per chunk, a library adds nothing.
- ``sentence``: chonkie's :class:`~chonkie.SentenceChunker` with the character tokenizer packs
  whole sentences greedily up to ``chunk_size`` characters (a sentence longer than that is a chunk
  of its own), with English and CJK sentence ends. chonkie returns exact character offsets (checked
  on English and Chinese text); :func:`~memreader.eval.chunkers.base.anchor_spans` re-checks them anyway.
"""

from __future__ import annotations

from memreader.eval.chunkers.base import (
    MIN_SENTENCE_CHARS,
    SENTENCE_DELIMITERS,
    anchor_spans,
    fixed_length_spans,
)
from memreader.eval.chunkers.calibrate import SizeParam


def fixed_param(target: int, longest: int) -> SizeParam:
    """Chunk length in characters; the mean is just under it (each document's last chunk is shorter)."""
    return SizeParam("chunk_chars", lo=1, hi=max(longest, target), start=target)


def fixed_spans(text: str, chunk_chars: float) -> list[tuple[int, int]]:
    """Fixed-length spans of ``chunk_chars`` characters."""
    return fixed_length_spans(text, int(chunk_chars))


def sentence_param(target: int, longest: int) -> SizeParam:
    """chonkie's ``chunk_size`` (characters): a ceiling, so the mean lies below it; start 1.3x above."""
    return SizeParam("chunk_size", lo=1, hi=max(longest, 2 * target), start=round(1.3 * target))


def sentence_spans_packed(text: str, chunk_size: float) -> list[tuple[int, int]]:
    """Whole sentences packed up to ``chunk_size`` characters (chonkie SentenceChunker)."""
    from chonkie import SentenceChunker

    chunker = SentenceChunker(tokenizer="character", chunk_size=int(chunk_size), chunk_overlap=0,
                              delim=SENTENCE_DELIMITERS, include_delim="prev",
                              min_characters_per_sentence=MIN_SENTENCE_CHARS)
    return anchor_spans(text, [(c.start_index, c.end_index, c.text) for c in chunker.chunk(text)], "sentence")
