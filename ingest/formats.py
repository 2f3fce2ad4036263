"""Text and structure out of one file: PDF, DOCX, HTML, Markdown, plain text.

    got = extract(Path("report.pdf"))      # Extracted(text, pages=[(0, 1), (1834, 2), ...], headings=None)
    got = extract(Path("guide.md"))        # headings=[(0, ["Guide"]), (412, ["Guide", "Install"]), ...]

Page and heading maps hold offsets into the returned text, so a chunk's start finds its page and heading path by
bisection (:func:`memreader.core.structure.page_at`, :func:`memreader.core.structure.headings_at`). A file that
cannot give text raises :class:`FileProblem` (kind, problem, fix). Libraries and the HTML rules, chosen by
measurement: docs/INGEST.md.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memreader.core.errors import MemReaderError

__all__ = ["FORMATS", "FURNITURE", "NON_TEXT", "Extracted", "FileProblem", "clean_text", "extract", "format_of",
           "from_blocks", "html_text"]

FORMATS = {".pdf": "pdf", ".docx": "docx", ".html": "html", ".htm": "html", ".xhtml": "html", ".md": "markdown",
           ".markdown": "markdown", ".txt": "text", ".text": "text", ".jsonl": "jsonl", ".parquet": "parquet"}
"""File extension → format (JSONL and Parquet corpora pass through, one document per record)."""
_HEADINGS = {f"h{i}": i for i in range(1, 7)}
_BLOCKS = {"p", "li", "pre", "blockquote", "td", "th", "dd", "dt", "figcaption", "caption", "div", "section",
           "article", "main", "aside", "header", "footer", "nav", "table", "tr", "ul", "ol", "dl", "figure", "form",
           "address", "body", *(_HEADINGS)}
NON_TEXT = "//script|//style|//noscript|//template|//head|//svg"
"""HTML elements that hold no text of the page (an XPath)."""
# Page furniture, dropped too: navigation, banners, site footers, sidebars, forms and their controls, hidden elements.
# A header or footer inside an article, section, main or aside belongs to that content (its title, its byline) and
# stays, as in the ARIA mapping (only a top-level header is a banner, a top-level footer the contentinfo); so does an
# aside inside an article (its note). Compared with trafilatura on real pages in docs/INGEST.md.
_IN_CONTENT = "ancestor::article or ancestor::main or ancestor::section or ancestor::aside or ancestor::nav"
FURNITURE = ("//nav|//form|//button|//select|//textarea|//dialog|//*[@hidden or @aria-hidden='true']"
             "|//*[@role='navigation' or @role='banner' or @role='contentinfo' or @role='search' or @role='menu' "
             "or @role='menubar' or @role='dialog' or (@role='complementary' and not(ancestor::article))]"
             f"|//header[not({_IN_CONTENT})]|//footer[not({_IN_CONTENT})]|//aside[not(ancestor::article)]")
"""HTML page furniture (an XPath), dropped with :data:`NON_TEXT`."""
# Pages without those tags and roles name their furniture in classes and ids (texinfo's div.header, DocBook's
# table.nav, a div#table_of_contents): such a block outside an article or main, mostly link text, is dropped too.
_NAV_NAMES = frozenset({"nav", "navbar", "navigation", "navheader", "navfooter", "navpanel", "menu", "menubar",
                        "sidebar", "breadcrumb", "breadcrumbs", "toc", "contents", "banner", "header", "footer", "pagination"})
_NAV_BLOCKS = frozenset({"div", "section", "table", "tr", "td", "ul", "ol", "dl", "p"})
_NAME_PARTS = re.compile(r"[\s_-]+")
_SPACES = re.compile(r"[ \t\r\f\v\u00a0]+")


class FileProblem(MemReaderError, ValueError):
    """A file that gives no text; ``kind`` says why (``encrypted``, ``no-text``, ``corrupt``, ``encoding``,
    ``unsupported``)."""

    def __init__(self, kind: str, problem: str, fix: str) -> None:
        super().__init__(problem, fix)
        self.kind = kind


@dataclass
class Extracted:
    """The text of a file, with its page map and heading map when the format has them."""

    text: str
    pages: list[tuple[int, int]] | None = None
    headings: list[tuple[int, list[str]]] | None = None


def format_of(path: Path) -> str | None:
    """The format of a file by its extension, None when unsupported."""
    return FORMATS.get(path.suffix.lower())


def extract(path: Path) -> Extracted:
    """The text and structure of one PDF, DOCX, HTML, Markdown or text file (see the module docstring)."""
    kind = format_of(path)
    readers = {"pdf": _pdf, "docx": _docx, "html": lambda p: html_text(p.read_bytes()), "markdown": _markdown,
               "text": lambda p: Extracted(_decode(p))}
    if kind not in readers:
        raise FileProblem("unsupported", f"unsupported file type {path.suffix or '(none)'!r}",
                          f"supported: {', '.join(sorted(FORMATS))}")
    return readers[kind](path)


def from_blocks(blocks: list[tuple[int, str]]) -> Extracted:
    """Paragraph blocks ``(heading level or 0, text)`` → text joined by blank lines, with the heading map (a
    heading of level ``n`` ends the path at depth ``n``; empty blocks are skipped). Every block-structured
    extractor (HTML, DOCX) ends here, so another one (``scripts/bench_html.py``: trafilatura) builds the same
    text and map from its blocks."""
    parts, headings, path = [], [], []
    offset = 0
    for level, text in blocks:
        if not text:
            continue
        if level:
            path = [*path[: level - 1], *[""] * max(0, level - 1 - len(path)), text][:level]
            headings.append((offset, [p for p in path if p]))
        parts.append(text)
        offset += len(text) + 2
    return Extracted("\n\n".join(parts), headings=headings)


def clean_text(text: str) -> str:
    """Runs of blanks (spaces, tabs, no-break spaces) as one space, each line stripped, empty lines dropped."""
    lines = [_SPACES.sub(" ", line).strip() for line in text.splitlines()]
    return "\n".join(line for line in lines if line)


def _decode(path: Path) -> str:
    data = path.read_bytes()
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FileProblem("encoding", f"not UTF-8 text (byte {exc.start} is invalid)",
                          f"re-encode it as UTF-8 (iconv -f <its encoding> -t UTF-8 {path.name})") from None


def _markdown(path: Path) -> Extracted:
    from markdown_it import MarkdownIt

    text = _decode(path)
    starts = [0, *itertools.accumulate(len(line) for line in text.splitlines(keepends=True))]
    tokens = MarkdownIt("commonmark").parse(text)
    headings, trail = [], []
    for i, token in enumerate(tokens):
        if token.type == "heading_open" and token.map:
            level = int(token.tag[1])
            title = tokens[i + 1].content.strip() if i + 1 < len(tokens) else ""
            trail = [*trail[: level - 1], *[""] * max(0, level - 1 - len(trail)), title][:level]
            headings.append((starts[token.map[0]], [t for t in trail if t]))
    return Extracted(text, headings=headings)


def html_text(data: bytes, drop: str = f"{NON_TEXT}|{FURNITURE}", link_blocks: bool = True,
              main_only: bool = True) -> Extracted:
    """The text and heading map of an HTML page, without the elements ``drop`` selects (an XPath; by default
    scripts, styles, the head and page furniture by tag and role); ``link_blocks``: without blocks named like
    navigation that are mostly links, too; ``main_only``: a page with one main element (``<main>``,
    ``role="main"``) gives that element's text only. Measured in ``scripts/bench_html.py``."""
    import lxml.etree
    import lxml.html

    if not data.strip():
        raise FileProblem("no-text", "the HTML file is empty", "check the file")
    try:
        root = lxml.html.document_fromstring(data)
    except (lxml.etree.ParserError, ValueError) as exc:
        raise FileProblem("corrupt", f"not parseable HTML ({exc})", "check the file") from None
    for node in [*root.xpath(drop), *(_link_blocks(root) if link_blocks else [])]:
        if node.getparent() is not None:  # the root itself is never dropped
            node.drop_tree()
    if main_only:
        mains = root.xpath("//main|//*[@role='main']")
        outer = [m for m in mains if not any(a in mains for a in m.iterancestors())]
        root = outer[0] if len(outer) == 1 else root
    blocks: list[tuple[int, str]] = []
    _walk(root, blocks)
    return from_blocks(blocks)


def _link_blocks(root: Any) -> list[Any]:
    """Blocks whose class or id names navigation (``nav-panel``, ``navheader``, ``table_of_contents``), outside an
    article or main, with at least half of their text in links."""
    found = []
    for el in root.iter(*_NAV_BLOCKS):
        names = set(_NAME_PARTS.split(f"{el.get('class', '')} {el.get('id', '')}".lower()))
        if not names & _NAV_NAMES or el.xpath("ancestor::article or ancestor::main or ancestor::*[@role='main']"):
            continue
        text = len("".join(el.itertext()).split())
        linked = sum(len("".join(a.itertext()).split()) for a in el.iter("a"))
        if text and linked >= text / 2:
            found.append(el)
    return found


def _walk(el: Any, out: list[tuple[int, str]]) -> None:
    """Block elements in document order: a heading or a block without block descendants is one paragraph;
    a block that holds others gives its own loose text and its children's."""
    tag = el.tag if isinstance(el.tag, str) else ""
    if tag in _HEADINGS:
        out.append((_HEADINGS[tag], clean_text(el.text_content()).replace("\n", " ")))
        return
    if not any(isinstance(d.tag, str) and d.tag in _BLOCKS for d in el.iterdescendants()):
        out.append((0, clean_text(el.text_content())))
        return
    out.append((0, clean_text(el.text or "")))
    for child in el:
        if isinstance(child.tag, str):  # not a comment or processing instruction
            _walk(child, out)
        out.append((0, clean_text(child.tail or "")))


def _docx(path: Path) -> Extracted:
    import zipfile

    import docx

    try:
        document = docx.Document(str(path))
    except (zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise FileProblem("corrupt", f"not a readable Word file ({type(exc).__name__}: {exc})",
                          "open and save it again in Word or LibreOffice (only .docx is read, not .doc)") from None
    blocks: list[tuple[int, str]] = []
    for item in document.iter_inner_content():
        if isinstance(item, docx.table.Table):
            rows = [" | ".join(clean_text(c.text) for c in row.cells) for row in item.rows]
            blocks.append((0, "\n".join(r for r in rows if r.strip(" |"))))
            continue
        style = (item.style.name if item.style is not None else "") or ""
        # the Title sits above Heading 1 (a document without one starts its paths at Heading 1 all the same)
        level = 1 if style == "Title" else int(style.split()[-1]) + 1 if re.fullmatch(r"Heading [1-9]", style) else 0
        blocks.append((level, clean_text(item.text)))
    return from_blocks(blocks)


def _pdf(path: Path) -> Extracted:
    from pypdf import PdfReader
    from pypdf.errors import FileNotDecryptedError, PdfReadError

    try:
        reader = PdfReader(str(path))
        encrypted = reader.is_encrypted
    except (PdfReadError, ValueError, OSError, KeyError, TypeError) as exc:
        raise FileProblem("corrupt", f"not a readable PDF ({type(exc).__name__}: {exc})",
                          "re-export the PDF, or repair it (qpdf in.pdf out.pdf)") from None
    if encrypted:
        try:  # an owner password alone (printing, copying limits) opens with the empty user password
            opened = bool(reader.decrypt(""))
        except (FileNotDecryptedError, NotImplementedError, PdfReadError):
            opened = False
        if not opened:
            raise FileProblem("encrypted", "the PDF is encrypted with a password",
                              "decrypt it first (qpdf --password=... --decrypt in.pdf out.pdf)")
    parts, pages = [], []
    offset = 0
    try:
        for number, page in enumerate(reader.pages, 1):
            text = "\n".join(line.rstrip() for line in (page.extract_text() or "").splitlines()).strip()
            if not text:
                continue
            pages.append((offset, number))
            parts.append(text)
            offset += len(text) + 2
    except (PdfReadError, ValueError, KeyError, TypeError) as exc:
        raise FileProblem("corrupt", f"a page of the PDF cannot be read ({type(exc).__name__}: {exc})",
                          "re-export the PDF, or repair it (qpdf in.pdf out.pdf)") from None
    if not parts:
        raise FileProblem("no-text", f"no text layer in any of its {len(reader.pages)} page(s)",
                          "run OCR first (e.g. ocrmypdf in.pdf out.pdf), then ingest the result")
    return Extracted("\n\n".join(parts), pages=pages)
