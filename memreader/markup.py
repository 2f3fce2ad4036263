"""The tag vocabulary of MemReader output and the escaping that keeps documents from breaking it.

A document may itself contain ``</document>``, ``<scenario>`` or ``[MASK]``. Before a document is
put into a prompt, those reserved markers are replaced by HTML-entity forms (``&lt;scenario>``,
``&#91;MASK]``); the parser splits model output on the real markers first and only then
unescapes the pieces, so a head or tail copied from such a document still aligns exactly.
Only the reserved markers are touched: all other text, including other ``<``, ``&`` and ``[``,
passes through unchanged.
"""

from __future__ import annotations

import re

MASK = "[MASK]"
RESERVED_TAGS = ("document", "think", "outline", "scenario", "chunk", "memory")

_TAG_RE = re.compile(r"<(/?)(" + "|".join(RESERVED_TAGS) + r")(\s*/?)>", re.IGNORECASE)
_ESC_TAG_RE = re.compile(r"&lt;(/?)(" + "|".join(RESERVED_TAGS) + r")(\s*/?)>", re.IGNORECASE)
_ESC_MASK = "&#91;MASK]"


def escape_markup(text: str) -> str:
    """Neutralise reserved tags and ``[MASK]`` inside ``text`` (reversible by :func:`unescape_markup`)."""
    text = _TAG_RE.sub(lambda m: f"&lt;{m.group(1)}{m.group(2)}{m.group(3)}>", text)
    return text.replace(MASK, _ESC_MASK)


def unescape_markup(text: str) -> str:
    """Undo :func:`escape_markup` on a piece of model output."""
    text = text.replace(_ESC_MASK, MASK)
    return _ESC_TAG_RE.sub(lambda m: f"<{m.group(1)}{m.group(2)}{m.group(3)}>", text)


def render_chunk_marker(chunk: str, head_chars: int = 12, tail_chars: int = 12) -> str:
    """``head[MASK]tail`` for a chunk, escaped; short chunks keep their whole text as the head."""
    if len(chunk) <= head_chars + tail_chars:
        return escape_markup(chunk) + MASK
    return escape_markup(chunk[:head_chars]) + MASK + escape_markup(chunk[-tail_chars:])


def render_memory(
    outline: list[str],
    chunks: list[str],
    cores: list[str],
    reasoning: str | None = None,
    head_chars: int = 12,
    tail_chars: int = 12,
) -> str:
    """The canonical MemReader output text for a memory (the SFT target, minus nothing)."""
    parts: list[str] = []
    if reasoning is not None:
        parts.append(f"<think>{reasoning.strip()}</think>")
    parts.append("<outline>\n" + "\n".join(o.replace("\n", " ").strip() for o in outline) + "\n</outline>")
    for chunk, core in zip(chunks, cores, strict=True):
        marker = render_chunk_marker(chunk, head_chars, tail_chars)
        parts.append(f"<scenario>\n<chunk>{marker}</chunk>\n{core.strip()}\n</scenario>")
    return "\n".join(parts)
