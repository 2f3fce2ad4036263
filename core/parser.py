"""Parse MemReader / teacher output into outline, chunk markers and core contents.

Real model output is sloppy; this parser repairs what it can and says what it repaired:
missing closing tags, prose around the answer, outline/scenario count mismatch, empty chunks,
a chunk without ``[MASK]``, output in another language than the document. It raises
:class:`ParseError` only when the output holds no chunk at all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from memreader.core.errors import MemReaderError
from memreader.core.language import is_chinese
from memreader.core.markup import MASK, unescape_markup


class ParseError(MemReaderError, ValueError):
    """The output holds nothing that can become a memory."""


@dataclass
class ParsedScenario:
    """One scenario as written by the model, before alignment."""

    head: str
    tail: str
    core: str
    outline: str = ""


@dataclass
class ParsedOutput:
    """Everything the parser could recover, plus a list of what it repaired."""

    reasoning: str | None
    outline: list[str]
    scenarios: list[ParsedScenario]
    diagnostics: list[str] = field(default_factory=list)


_LIST_MARKER = re.compile(r"^\s*(?:[-*•]\s*|\d+[.)、](?!\d)\s*)")


def _block(text: str, tag: str, stop_tags: tuple[str, ...], diags: list[str]) -> tuple[str | None, str]:
    """Content of the first ``<tag>`` block and the text after it; tolerates a missing close tag."""
    m = re.search(rf"<{tag}\s*>", text, re.IGNORECASE)
    if not m:
        return None, text
    rest = text[m.end() :]
    close = re.search(rf"</{tag}\s*>", rest, re.IGNORECASE)
    stop = None
    if stop_tags:
        stop = re.search(r"<(?:" + "|".join(stop_tags) + r")\s*>", rest, re.IGNORECASE)
    if close and (stop is None or close.start() <= stop.start()):
        return rest[: close.start()], rest[close.end() :]
    end = stop.start() if stop else len(rest)
    diags.append(f"missing </{tag}>: closed it at {'<' + stop.group(0)[1:] if stop else 'end of output'}")
    return rest[:end], rest[end:]


def _split_chunk(raw: str, diags: list[str], index: int) -> tuple[str, str]:
    raw = raw.strip()
    if MASK in raw:
        head, tail = raw.split(MASK, 1)
        if MASK in tail:
            diags.append(f"scenario {index}: several [MASK] markers; kept the text around the first")
            tail = tail.rsplit(MASK, 1)[1]
        head, tail = unescape_markup(head.strip()), unescape_markup(tail.strip())
        if not head and not tail:
            diags.append(f"scenario {index}: empty chunk marker")
        return head, tail
    if not raw:
        diags.append(f"scenario {index}: empty chunk")
        return "", ""
    diags.append(f"scenario {index}: chunk has no [MASK]; treated its text as the whole chunk")
    text = unescape_markup(raw)
    return text, text


def _scenario_bodies(text: str, diags: list[str]) -> list[str]:
    """Bodies of ``<scenario>`` blocks, or of ``<chunk>``-started sections when there are none."""
    opens = list(re.finditer(r"<scenario\s*>", text, re.IGNORECASE))
    keep_open_tag = not opens
    if keep_open_tag:
        opens = list(re.finditer(r"<chunk\s*>", text, re.IGNORECASE))
        if opens:
            diags.append("no <scenario> tags: split scenarios at each <chunk>")
    bodies = []
    for i, m in enumerate(opens):
        end = opens[i + 1].start() if i + 1 < len(opens) else len(text)
        body = text[m.start() if keep_open_tag else m.end() : end]
        close = re.search(r"</scenario\s*>", body, re.IGNORECASE)
        if close:
            body = body[: close.start()]
        elif not keep_open_tag:
            diags.append(f"scenario {i}: missing </scenario>")
        bodies.append(body)
    return bodies


def parse_output(text: str, document: str | None = None) -> ParsedOutput:
    """Parse model output; ``document`` (optional) enables the wrong-language check."""
    diags: list[str] = []
    reasoning, rest = _block(text, "think", ("outline", "scenario"), diags)
    if reasoning is None and re.search(r"</think\s*>", text, re.IGNORECASE):
        # Some chat templates put <think> into the prompt, so the output starts inside it.
        reasoning, rest = re.split(r"</think\s*>", text, maxsplit=1, flags=re.IGNORECASE)
        diags.append("output began inside <think>: took the text before </think> as reasoning")
    outline_text, rest_after_outline = _block(rest, "outline", ("scenario", "chunk"), diags)
    if outline_text is None:
        diags.append("no <outline> block")
        outline: list[str] = []
    else:
        rest = rest_after_outline
        # Strip list markers ("- ", "1. ", "2)") but not the digits of "3.5 million".
        outline = [unescape_markup(_LIST_MARKER.sub("", ln).strip()) for ln in outline_text.splitlines()]
        outline = [o for o in outline if o]

    scenarios: list[ParsedScenario] = []
    for i, body in enumerate(_scenario_bodies(rest, diags)):
        m = re.search(r"<chunk\s*>", body, re.IGNORECASE)
        if not m:
            diags.append(f"scenario {i}: no <chunk>; treated it as an empty chunk")
            scenarios.append(ParsedScenario("", "", unescape_markup(body.strip())))
            continue
        after = body[m.end() :]
        close = re.search(r"</chunk\s*>", after, re.IGNORECASE)
        if close:
            raw_chunk, core = after[: close.start()], after[close.end() :]
        else:
            nl = after.find("\n")
            raw_chunk, core = (after, "") if nl < 0 else (after[:nl], after[nl + 1 :])
            diags.append(f"scenario {i}: missing </chunk>; the chunk marker ended at the line end")
        head, tail = _split_chunk(raw_chunk, diags, i)
        core = unescape_markup(core.strip())
        if not core:
            diags.append(f"scenario {i}: empty core content")
        scenarios.append(ParsedScenario(head, tail, core))

    if not scenarios:
        raise ParseError("the output contains no <scenario> or <chunk> block, so no chunk can be aligned; first 200 "
                         f"characters were: {text[:200]!r}. Check the prompt template and the model's "
                         "max_new_tokens (a cut-off generation often loses every scenario).")

    if len(outline) != len(scenarios):
        diags.append(f"outline has {len(outline)} item(s) for {len(scenarios)} scenario(s); missing items taken "
                     "from the core content, extra items dropped")
    for i, sc in enumerate(scenarios):
        if i < len(outline):
            sc.outline = outline[i]
        else:
            first_line = sc.core.strip().splitlines()[0] if sc.core.strip() else (sc.head or f"part {i + 1}")
            sc.outline = first_line[:60]
    outline = [sc.outline for sc in scenarios]

    if document is not None and document.strip():
        doc_zh = is_chinese(document)
        out_zh = is_chinese([*(sc.core for sc in scenarios), *outline])
        if doc_zh != out_zh:
            diags.append(f"language mismatch: document looks {'Chinese' if doc_zh else 'non-Chinese'}, "
                         f"outline/core look {'Chinese' if out_zh else 'non-Chinese'}")
    return ParsedOutput(unescape_markup(reasoning.strip()) if reasoning else None, outline, scenarios, diags)
