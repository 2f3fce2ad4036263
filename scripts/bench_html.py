"""HTML main content for ``memreader ingest``: page furniture dropped by tag and role, against trafilatura.

    .venv/bin/python scripts/bench_html.py                  # the real pages found on this machine, one run
    .venv/bin/python scripts/bench_html.py --repeat 5       # time per page: the best of 5
    .venv/bin/python scripts/bench_html.py --page page.html //main  # another page and its content's XPath

Real HTML pages that ship with the machine's software (Node.js and npm manuals, the Rust book, Debian's Python
policy, libxslt, libffi and Valgrind manuals: eight page generators, from hand-written table layouts to mdBook
and Sphinx); the pages not present are skipped and named. Each page's **content** is the element that a reader
of it sees as the text (an XPath per page generator, chosen by reading the pages, with what it holds of
navigation taken out), and its **furniture** is every other word of the page. Printed per extractor, side by
side in one run:

- ``content``: the share of the content's words in the extracted text (multiset recall);
- ``furniture dropped``: the share of the page's non-content words that are not in the text;
- ``headings``: the share of the content's h1-h6 that are in the heading map, at an offset where the text
  holds that heading;
- ``ms/page``: extraction time, the best of ``--repeat`` runs.

Extractors, each adding one rule of ``memreader.ingest.formats.html_text`` to the one before: ``lxml`` (scripts, styles and
the head dropped only: what ingest did before), ``tags+roles`` (page furniture by tag and ARIA role: nav, top-level
header and footer, aside, form, role=navigation/banner/contentinfo, ...), ``+names`` (blocks whose class or id
names navigation and whose text is mostly links), ``+main`` (a page with one main element gives only its text:
what ingest does now); and ``trafilatura`` (its main-content extraction with formatting, tables and headings, its
XML body walked into paragraphs and the heading map; in the ``dev`` extra, left out when not installed).
"""

from __future__ import annotations

import argparse
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

from memreader.ingest.formats import FURNITURE, NON_TEXT, Extracted, clean_text, from_blocks, html_text

RUST = Path.home() / ".rustup/toolchains/stable-x86_64-unknown-linux-gnu/share/doc/rust/html/book"
NODE, NPM = Path("/usr/share/doc/nodejs/api"), Path("/usr/lib/node_modules/npm/docs/output")
DOC = Path("/usr/share/doc")
# page -> (content XPath, XPath of the navigation inside the content)
PAGES: dict[Path, tuple[str, str]] = {
    NODE / "dns.html": ("//*[@id='apicontent']", ""),
    NODE / "path.html": ("//*[@id='apicontent']", ""),
    NPM / "commands/npm-install.html": ("//header[@class='title']|//*[@id='_content']", ""),
    NPM / "using-npm/scripts.html": ("//header[@class='title']|//*[@id='_content']", ""),
    RUST / "ch03-01-variables-and-mutability.html": ("//main", ""),
    RUST / "ch04-01-what-is-ownership.html": ("//main", ""),
    DOC / "python3/python-policy.html": ("//*[@role='main']", "//a[@class='headerlink']"),
    DOC / "libxslt1-dev/html/intro.html": ("//td[starts-with(normalize-space(.), 'This document describes')]", ""),
    DOC / "libffi8/html/The-Basics.html": ("//body", "//div[@class='header']"),
    DOC / "valgrind/html/manual-core.html": ("//div[@class='chapter']", "//div[@class='toc']"),
}
_WORD = re.compile(r"\w+")


def words(text: str) -> Counter[str]:
    return Counter(_WORD.findall(text.lower()))


def reference(data: bytes, content: str, inner_nav: str) -> tuple[Counter[str], Counter[str], list[str]]:
    """(content words, page words, content headings) of a page."""
    import lxml.html

    root = lxml.html.document_fromstring(data)
    for node in root.xpath(NON_TEXT):
        node.drop_tree()
    page = words(" ".join(root.itertext()))  # blanks between elements: text_content() glues <li>a</li><li>b</li>
    for node in root.xpath(f"//button{'|' + inner_nav if inner_nav else ''}"):  # buttons: UI, never content
        node.drop_tree()
    found = root.xpath(content)
    parts = [p for p in found if not any(a in found for a in p.iterancestors())]  # outermost matches only
    assert parts, f"no {content} in the page"
    heads = [" ".join(" ".join(h.itertext()).split()) for p in parts for h in p.iter("h1", "h2", "h3", "h4", "h5", "h6")]
    return sum((words(" ".join(p.itertext())) for p in parts), Counter()), page, [h for h in heads if h]


def trafilatura_text(data: bytes) -> Extracted:
    """trafilatura's main content, its XML body (head rend=hN, p, list/item, code, table/row/cell) as paragraphs."""
    import trafilatura

    doc = trafilatura.bare_extraction(data.decode("utf-8", "replace"), include_formatting=True,
                                      include_tables=True, include_comments=False, with_metadata=False)
    blocks: list[tuple[int, str]] = []
    leaves = {"head", "p", "item", "code", "cell", "quote", "list", "row", "table"}

    def walk(el: Any) -> None:
        if el.tag == "head":
            level = int((el.get("rend") or "h2")[1:] or 2) if (el.get("rend") or "").startswith("h") else 2
            blocks.append((level, " ".join("".join(el.itertext()).split())))
        elif el.tag in leaves and not any(d.tag in leaves for d in el.iterdescendants()):
            blocks.append((0, clean_text("".join(el.itertext()))))
        else:
            if el.text and el.text.strip():
                blocks.append((0, clean_text(el.text)))
            for child in el:
                walk(child)
                if child.tail and child.tail.strip():
                    blocks.append((0, clean_text(child.tail)))

    if doc is not None and doc.body is not None:
        walk(doc.body)
    return from_blocks(blocks)


EXTRACTORS: dict[str, Any] = {
    "lxml": lambda data: html_text(data, NON_TEXT, link_blocks=False, main_only=False),
    "tags+roles": lambda data: html_text(data, f"{NON_TEXT}|{FURNITURE}", link_blocks=False, main_only=False),
    "+names": lambda data: html_text(data, f"{NON_TEXT}|{FURNITURE}", link_blocks=True, main_only=False),
    "+main": lambda data: html_text(data),
    "trafilatura": trafilatura_text,
}


def score(got: Extracted, content: Counter[str], page: Counter[str], heads: list[str]) -> dict[str, float]:
    out = words(got.text)
    furniture = page - content
    kept_heads = 0
    for head in heads:  # the same words (a permalink mark such as # or ¶ aside), and the text holds them there
        kept_heads += any(path and _WORD.findall(path[-1]) == _WORD.findall(head)
                          and got.text[o:o + len(path[-1])] == path[-1] for o, path in got.headings or [])
    return {"content": sum((out & content).values()) / max(1, sum(content.values())),
            "furniture dropped": 1 - sum((out - content).values()) / max(1, sum(furniture.values())),
            "headings": kept_heads / len(heads) if heads else 1.0}


def _cell(row: dict[str, float]) -> str:
    return (f"{row['content']:5.0%} {max(row['furniture dropped'], 0):5.0%} {row['headings']:5.0%} "
            f"{row['ms']:6.1f}").rjust(23)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="time each extraction this many times, keep the best")
    ap.add_argument("--page", action="append", default=[], nargs="+", metavar="FILE CONTENT_XPATH [NAV_XPATH]",
                    help="measure this page instead of the machine's (repeat): the XPath of its content and, "
                         "optionally, of the navigation inside the content")
    args = ap.parse_args()
    if any(len(spec) not in (2, 3) for spec in args.page):
        ap.error("--page takes FILE CONTENT_XPATH [NAV_XPATH]")
    try:
        import trafilatura  # noqa: F401
    except ImportError:
        print("trafilatura is not installed (pip install -e '.[dev]'): its column is left out")
        EXTRACTORS.pop("trafilatura")
    wanted = {Path(spec[0]): (spec[1], spec[2] if len(spec) == 3 else "") for spec in args.page} or PAGES
    pages = {p: spec for p, spec in wanted.items() if p.is_file()}
    for p in sorted(set(wanted) - set(pages)):
        print(f"skipped (not on this machine): {p}")
    if not pages:
        raise SystemExit("no page to measure: none of the pages is on this machine; name one with --page")
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in EXTRACTORS}
    print(f"{'':40} {'':>4} " + " ".join(f"{n:^23}" for n in EXTRACTORS))
    print(f"{'page':40} {'KB':>4} " + " ".join(f"{'text furn. head   ms':>23}" for _ in EXTRACTORS))
    for path, (content_xp, nav_xp) in pages.items():
        data = path.read_bytes()
        content, page, heads = reference(data, content_xp, nav_xp)
        cells = []
        for name, extract in EXTRACTORS.items():
            best = float("inf")
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                got = extract(data)
                best = min(best, time.perf_counter() - t0)
            row = {**score(got, content, page, heads), "ms": best * 1000}
            rows[name].append(row)
            cells.append(_cell(row))
        label = f"{path.parent.name}/{path.name}"[-40:]
        print(f"{label:40} {len(data) // 1024:4d} " + " ".join(cells))
    means = [{k: sum(r[k] for r in rs) / len(rs) for k in rs[0]} for rs in rows.values()]
    print(f"{'mean over ' + str(len(pages)) + ' pages':40} {'':>4} " + " ".join(_cell(m) for m in means))
    base = sum(r["ms"] for r in rows["+main"])
    print("time ratio to +main (what ingest does): " + ", ".join(f"{n} {sum(r['ms'] for r in rs) / base:.2f}x"
                                                         for n, rs in rows.items()))


if __name__ == "__main__":
    main()
