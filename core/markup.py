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

_TAGS = "|".join(RESERVED_TAGS)
_TAG_RE = re.compile(rf"<(/?)({_TAGS})(\s*/?)>", re.IGNORECASE)
_ESC_TAG_RE = re.compile(rf"&lt;(/?)({_TAGS})(\s*/?)>", re.IGNORECASE)
_ESC_MASK = "&#91;MASK]"
# An "&" that starts one of our escape forms (or an "&amp;" in front of one) is itself escaped,
# which makes the scheme exactly reversible even for text that already contains these forms.
_AMP_RE = re.compile(rf"&(?=amp;|lt;/?(?:{_TAGS})\s*/?>|#91;MASK\])", re.IGNORECASE)
_ESC_AMP_RE = re.compile(rf"&amp;(?=amp;|lt;/?(?:{_TAGS})\s*/?>|#91;MASK\])", re.IGNORECASE)


def escape_markup(text: str) -> str:
    """Neutralise reserved tags and ``[MASK]`` inside ``text``; :func:`unescape_markup` inverts it exactly."""
    text = _AMP_RE.sub("&amp;", text)
    text = _TAG_RE.sub(lambda m: f"&lt;{m.group(1)}{m.group(2)}{m.group(3)}>", text)
    return text.replace(MASK, _ESC_MASK)


def unescape_markup(text: str) -> str:
    """Undo :func:`escape_markup` on a piece of model output."""
    text = text.replace(_ESC_MASK, MASK)
    text = _ESC_TAG_RE.sub(lambda m: f"<{m.group(1)}{m.group(2)}{m.group(3)}>", text)
    return _ESC_AMP_RE.sub("&", text)


def render_chunk_marker(chunk: str, head_chars: int = 12, tail_chars: int = 12) -> str:
    """``head[MASK]tail`` for a chunk, escaped; short chunks keep their whole text as the head.

    Head and tail are taken from the chunk without its edge whitespace (a run of blanks says
    nothing about where a chunk is); the aligner gives such whitespace to the earlier chunk.
    """
    text = chunk.strip()
    if len(text) <= head_chars + tail_chars:
        return escape_markup(text) + MASK
    return escape_markup(text[:head_chars]) + MASK + escape_markup(text[-tail_chars:])


def render_memory(outline: list[str], chunks: list[str], cores: list[str], reasoning: str | None = None,
                  head_chars: int = 12, tail_chars: int = 12) -> str:
    """The canonical MemReader output text for a memory (the SFT target). Every free-text part
    (reasoning, outline, core) is escaped like the document, so text that mentions a tag cannot
    become one; the parser unescapes each part after splitting."""
    parts: list[str] = []
    if reasoning is not None:
        parts.append(f"<think>{escape_markup(reasoning.strip())}</think>")
    topics = (escape_markup(" ".join(o.splitlines()).strip()) for o in outline)
    parts.append("<outline>\n" + "\n".join(topics) + "\n</outline>")
    for chunk, core in zip(chunks, cores, strict=True):
        marker = render_chunk_marker(chunk, head_chars, tail_chars)
        parts.append(f"<scenario>\n<chunk>{marker}</chunk>\n{escape_markup(core.strip())}\n</scenario>")
    return "\n".join(parts)
