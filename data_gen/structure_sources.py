"""Where documents with gold structure come from: passages of public corpora, and sections of real manuals.

    passages = hotpot_passages(shared) + cmrc_passages(shared) + crud_passages(shared) + longbench_passages(shared)
    pages = manual_pages("artifacts/runs/python3-doc/ingest/corpus.jsonl")   # `memreader ingest` of an HTML manual

A :class:`Passage` carries its ``unit`` (the source item: two passages of one unit are never joined, and splits never
share a unit); a :class:`Page` is one ingested manual file's sections with the heading lines taken out (the gold
titles). Details: docs/TRAINING.md (A teacher that knows the answer: the structure teacher).
"""

from __future__ import annotations

import ast
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from memreader.core.errors import MemReaderError

EN_RANGE = (150, 900)  # characters per English passage (the grammar allows 150-1200)
ZH_RANGE = (60, 360)  # per Chinese passage (60-480 allowed; SmolLM2 spends ~1.9 tokens a Chinese character)
_ZH_END = re.compile(r"[^。！？]*[。！？]+[”’」』）)]*")
_EN_END = re.compile(r".+?[.!?][\"'”’)\]]*(?=\s|$)\s*", re.S)
DEBIAN_MANUALS = {
    "python3-doc": ("python3-doc", "/usr/share/doc/python3/html/library"),
    "debian-reference-zh-cn": ("debian-reference-zh-cn", "/usr/share/debian-reference"),
    "debian-handbook-zh-cn": ("debian-handbook", "/usr/share/doc/debian-handbook/html/zh-CN"),
    "maint-guide-zh-cn": ("maint-guide-zh-cn", "/usr/share/doc/maint-guide-zh-cn/html"),
    "debian-faq-zh-cn": ("debian-faq-zh-cn", "/usr/share/doc/debian/FAQ/zh-cn"),
}
"""Real sectioned HTML manuals from Debian's archive: name (the ingest run) → (package, folder). Each page's language
is read from its text (:func:`manual_pages`): the Debian Administrator's Handbook's zh-CN has a few untranslated,
English pages. The Chinese ones beside the Debian reference: that handbook, the New Maintainers' Guide, the FAQ."""


class StructureDataError(MemReaderError, ValueError):
    """A source of structure data is missing or unusable (message: problem — fix)."""


@dataclass
class Passage:
    title: str
    text: str
    lang: str
    source: str
    unit: str


@dataclass
class Section:
    title: str
    text: str


@dataclass
class Page:
    """One manual file: its sections in order (heading lines removed)."""

    unit: str
    lang: str
    source: str
    sections: list[Section]


def sentences(text: str, lang: str) -> list[str]:
    """``text`` as consecutive sentences that concatenate back to it (a tail without an end mark included)."""
    pattern = _ZH_END if lang == "zh" else _EN_END
    out, pos = [], 0
    for m in pattern.finditer(text):
        if m.start() != pos:
            break
        out.append(m.group())
        pos = m.end()
    return out


def lead(text: str, lang: str, rng: random.Random, bounds: tuple[int, int] | None = None) -> str | None:
    """The leading sentences of ``text`` up to a length drawn from the language's range; None below its minimum."""
    lo, hi = bounds or (EN_RANGE if lang == "en" else ZH_RANGE)
    target = rng.randint(lo, hi)
    out = ""
    for s in sentences(text, lang):
        if len(out) + len(s) > hi or (len(out) >= target):
            break
        out += s
    out = out.strip()
    return out if len(out) >= lo else None


def topic_title(heading: str) -> str:
    """A part's gold title as a reader could write it from the part: the heading's words without a leading section
    number (``9.7.5. ``, ``2. ``, ``1.2 ``) or a trailing permalink mark (``¶``, ``#``), which no text shows."""
    title = re.sub(r"\s*[¶#]+\s*$", "", heading.strip())
    return re.sub(r"^\d+(?:\.\d+)*\.\s+(?=\S)|^\d+(?:\.\d+)+\s+(?=\S)", "", title).strip()


def _need(path: Path, what: str) -> Path:
    if not path.is_file():
        raise StructureDataError(f"{path} does not exist ({what})",
                                 "give shared= the folder of the benchmark files (../shared/datasets in a checkout)")
    return path


def hotpot_passages(shared: Path, rng: random.Random) -> tuple[list[Passage], list[list[str]]]:
    """English passages (one per HotpotQA-100 paragraph title) and each question's context titles."""
    corpus = json.loads(_need(shared / "hotpotqa_100_corpus.json", "HotpotQA paragraphs").read_text(encoding="utf-8"))
    out = []
    for title, sents in corpus.items():
        text = lead(" ".join(s.strip() for s in sents), "en", rng)
        if text:
            out.append(Passage(title, text, "en", "hotpotqa", f"hotpotqa:{title}"))
    qa = json.loads(_need(shared / "hotpotqa_100_qa.json", "HotpotQA questions").read_text(encoding="utf-8"))
    groups = []
    for item in qa:
        ctx = item["context"]
        ctx = ast.literal_eval(ctx) if isinstance(ctx, str) else ctx
        groups.append([title for title, _ in ctx])
    return out, groups


def cmrc_passages(shared: Path, rng: random.Random) -> list[Passage]:
    """Chinese passages: every paragraph of CMRC 2018's Wikipedia articles (unit: the article)."""
    data = json.loads(_need(shared / "cmrc2018_dev.json", "CMRC 2018").read_text(encoding="utf-8"))["data"]
    out = []
    for art in data:
        title = art.get("title", "").strip()
        for par in art["paragraphs"]:
            text = lead(re.sub(r"\s*\n\s*", "", par["context"]).strip(), "zh", rng)
            if title and text:
                out.append(Passage(title, text, "zh", "cmrc2018", f"cmrc2018:{title}"))  # each paragraph: its article's
    return out


def crud_passages(shared: Path, rng: random.Random) -> list[Passage]:
    """Chinese passages: CRUD-RAG's event summaries (unit: the news item)."""
    out = []
    path = _need(shared / "crud_event_summary.jsonl", "CRUD-RAG event summaries")
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            item = json.loads(line)
            text = lead(re.sub(r"\s+", "", item.get("summary") or ""), "zh", rng)
            if text:
                out.append(Passage(item.get("title") or item["event"][:30], text, "zh", "crud",
                                   f"crud:{item.get('ID') or item['event'][:40]}"))
    return out


def longbench_passages(shared: Path, rng: random.Random) -> list[Passage]:
    """Chinese passages: LongBench MultiFieldQA-zh contexts cut at their line breaks (unit: the context; a context
    that recurs is used once)."""
    out, seen = [], set()
    path = _need(shared / "longbench_multifieldqa_zh.jsonl", "LongBench MultiFieldQA-zh")
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            context = json.loads(line)["context"]
            key = context[:200]
            if key in seen:
                continue
            seen.add(key)
            unit = f"longbench:{len(seen)}"
            title = context.split("\n", 1)[0][:40]
            for par in (p.strip() for p in context.split("\n")):
                text = lead(par, "zh", rng)
                if text:
                    out.append(Passage(title, text, "zh", "longbench", unit))  # the context's first line
    return out


def markdown_pages(folder: Path) -> list[Page]:
    """This project's Markdown docs as pages of ``##`` sections (heading lines removed)."""
    pages = []
    for path in sorted(folder.glob("*.md")):
        parts = re.split(r"(?m)^(?=## )", path.read_text(encoding="utf-8"))
        secs = [Section(topic_title(heading.lstrip("#")), body.lstrip("\n"))
                for heading, _, body in (part.partition("\n") for part in parts[1:])]
        pages.append(Page(f"docs:{path.name}", "en", f"docs/{path.name}", secs))
    return pages


def resolve_manual(entry: str, home: Path) -> Path:
    """The ingested corpus of a manual: a corpus JSONL path as given, or a Debian manual's name (its corpus under
    ``$MEMREADER_HOME/runs/<name>/ingest/``), named with the ``apt-get`` line when the package is not installed and
    with the ``memreader ingest`` line when it is not ingested yet."""
    if entry in DEBIAN_MANUALS:
        package, folder = DEBIAN_MANUALS[entry]
        if not Path(folder).is_dir():
            raise StructureDataError(f"the Debian manual {entry} is not installed ({folder} does not exist)",
                                     f"apt-get install {package} (as root), then memreader ingest {folder} --set "
                                     f"run={entry}")
        corpus = home / "runs" / entry / "ingest" / "corpus.jsonl"
        if not corpus.is_file():
            raise StructureDataError(f"the manual {entry} is installed but not ingested ({corpus} does not exist)",
                                     f"memreader ingest {folder} --set run={entry}")
        return corpus
    path = Path(entry)
    if not path.is_file():
        raise StructureDataError(f"manual corpus {entry} does not exist",
                                 "give the corpus.jsonl `memreader ingest <folder of HTML/Markdown/Word files>` wrote, "
                                 f"or one of {', '.join(DEBIAN_MANUALS)}")
    return path


def _strip_heading(text: str, heading: str) -> str:
    """The section's text without its heading line (the first line when it carries the heading's words)."""
    first, _, rest = text.partition("\n")
    words = re.sub(r"[\s¶#]+", " ", heading).strip()
    if words and words[:20] in re.sub(r"[\s¶#]+", " ", first):
        return rest.lstrip("\n")
    return text


def manual_pages(corpus: Path, lang: str = "") -> list[Page]:
    """Pages of an ingested manual: each record's sections from its heading map, heading lines removed. Records
    without a heading map are skipped; a corpus with none at all is named with the fix."""
    pages, skipped = [], 0
    with corpus.open(encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            heads = rec.get("headings") or (rec.get("meta") or {}).get("headings") or []
            text = rec["text"]
            if len(heads) < 2:
                skipped += 1
                continue
            secs = []
            for (start, path), nxt in zip(heads, [*heads[1:], [len(text), None]], strict=True):
                body = _strip_heading(text[start:nxt[0]], path[-1] if path else "")
                if body.strip():
                    secs.append(Section(topic_title(path[-1]) if path else "", body))
            page_lang = lang or ("zh" if sum("\u4e00" <= c <= "\u9fff" for c in text[:3000]) > 300 else "en")
            name = corpus.parent.parent.name  # the ingest run: the manual's name for a Debian manual
            pages.append(Page(f"{name}:{rec['id']}", page_lang, f"{name}/{rec['id']}", secs))
    if not pages:
        raise StructureDataError(f"{corpus}: none of its {skipped} records has a heading map with two headings or more",
                                 "ingest a folder of structured files (HTML with <h1>-<h6>, Markdown, Word) with "
                                 "`memreader ingest`")
    return pages


def section_passages(pages: list[Page], rng: random.Random) -> list[Passage]:
    """Each manual section's lead as a passage (unit: its page), for joined documents."""
    out = []
    for page in pages:
        for sec in page.sections:
            text = lead(re.sub(r"\n{3,}", "\n\n", sec.text).strip(), page.lang, rng)
            if text:
                out.append(Passage(sec.title, text, page.lang, page.source.split("/")[0] if page.unit.startswith(
                    "docs:") else page.unit.split(":")[0], page.unit))
    return out
