"""memreader structure-data's sources: manual pages from an ingested corpus (headings out of the text, sections as
gold), the Debian manuals named with their install and ingest lines, and sectioned documents whose boundaries are
the section starts (the whole command on tiny data sets: tests/test_scripts_smoke.py::test_structure_data)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from memreader.data_gen.structure_data import StructureDataConfig, sectioned
from memreader.data_gen.structure_sources import (
    DEBIAN_MANUALS,
    StructureDataError,
    lead,
    manual_pages,
    resolve_manual,
    sentences,
    topic_title,
)

SECTION = ("The parser reads the file line by line. Each line is split at the first equals sign. Keys are "
           "stripped of blanks and lower-cased. Values keep their case. A line that starts with a hash is a comment.")
OTHER = ("Sockets talk to peers over the network. A server binds an address and listens. A client connects to it. "
         "Both then send and receive bytes until one side closes the connection cleanly.")


def ingested(tmp_path: Path, records: list[dict]) -> Path:
    """A corpus as `memreader ingest` writes it: runs/<name>/ingest/corpus.jsonl."""
    path = tmp_path / "runs" / "mymanual" / "ingest" / "corpus.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def page_record(doc_id: str, titles: list[str]) -> dict:
    text, heads = "", []
    for k, title in enumerate(titles):
        heads.append([len(text), ["Manual", f"{title}¶"]])
        text += f"{title}¶\n\n{SECTION if k % 2 == 0 else OTHER}\n\n"
    return {"id": doc_id, "text": text, "headings": heads, "source": doc_id, "format": "html"}


def test_manual_pages_take_the_heading_lines_out_and_keep_the_titles(tmp_path: Path) -> None:
    corpus = ingested(tmp_path, [page_record("a.html", ["Parsing", "Sockets", "Parsing again"]),
                                 {"id": "flat.html", "text": "no headings here", "headings": []}])
    pages = manual_pages(corpus)
    assert len(pages) == 1  # the record without a heading map is not a sectioned page
    page = pages[0]
    assert page.unit == "mymanual:a.html" and page.source == "mymanual/a.html" and page.lang == "en"
    assert [s.title for s in page.sections] == ["Parsing", "Sockets", "Parsing again"]
    assert all("¶" not in s.text and s.text.startswith(("The parser", "Sockets talk")) for s in page.sections)
    assert page.sections[1].text.startswith("Sockets talk")


def test_gold_titles_keep_only_what_a_reader_could_write(tmp_path: Path) -> None:
    """Section numbers and permalink marks are not in the text a reader sees, so they are not in the gold title."""
    corpus = ingested(tmp_path, [page_record("b.html", ["9.7.5. 制作空的磁盘映像文件", "1.2 Sockets", "2. Parsing"])])
    assert [s.title for s in manual_pages(corpus)[0].sections] == ["制作空的磁盘映像文件", "Sockets", "Parsing"]
    for kept in ("2024 results", "Python 3.12 changes", "3 Usage", "pyclbr — Python module browser support"):
        assert topic_title(kept) == kept
    assert topic_title("Section #") == "Section" and topic_title("Class Objects¶") == "Class Objects"


def test_sectioned_documents_have_gold_boundaries_at_the_section_starts(tmp_path: Path) -> None:
    pages = manual_pages(ingested(tmp_path, [page_record("a.html", ["One", "Two", "Three", "Four"])]))
    docs = sectioned(pages, "sec", StructureDataConfig(min_parts=2, max_parts=4), random.Random(0))
    assert docs
    for doc in docs:
        assert "".join(s["text"] for s in doc["sections"]) == doc["text"]
        starts = [sum(len(s["text"]) for s in doc["sections"][:k]) for k in range(1, len(doc["sections"]))]
        assert doc["boundaries"] == starts and doc["kind"] == "sections" and doc["group"] == "mymanual:a.html"
        assert "One" not in doc["text"] and "¶" not in doc["text"]  # the reader never sees a heading


def test_a_corpus_without_heading_maps_is_named_with_the_fix(tmp_path: Path) -> None:
    corpus = ingested(tmp_path, [{"id": "x.txt", "text": "plain text", "headings": []}])
    with pytest.raises(StructureDataError, match="heading map.*memreader ingest"):
        manual_pages(corpus)


def test_a_debian_manual_not_installed_is_named_with_the_apt_line(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(DEBIAN_MANUALS, "python3-doc", ("python3-doc", str(tmp_path / "absent")))
    with pytest.raises(StructureDataError, match="apt-get install python3-doc"):
        resolve_manual("python3-doc", tmp_path)
    # a manual named apart from its package (one language of a many-language package) names the package
    monkeypatch.setitem(DEBIAN_MANUALS, "debian-handbook-zh-cn", ("debian-handbook", str(tmp_path / "absent")))
    with pytest.raises(StructureDataError, match=r"apt-get install debian-handbook \(as root\).*run=debian-handbook-zh-cn"):
        resolve_manual("debian-handbook-zh-cn", tmp_path)


def test_a_debian_manual_not_ingested_is_named_with_the_ingest_line(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "html"
    folder.mkdir()
    monkeypatch.setitem(DEBIAN_MANUALS, "python3-doc", ("python3-doc", str(folder)))
    with pytest.raises(StructureDataError, match=f"memreader ingest {folder} --set run=python3-doc"):
        resolve_manual("python3-doc", tmp_path)
    corpus = tmp_path / "runs" / "python3-doc" / "ingest" / "corpus.jsonl"
    corpus.parent.mkdir(parents=True)
    corpus.write_text("", encoding="utf-8")
    assert resolve_manual("python3-doc", tmp_path) == corpus
    with pytest.raises(StructureDataError, match="does not exist"):
        resolve_manual(str(tmp_path / "nope.jsonl"), tmp_path)


def test_sentences_tile_and_leads_stay_in_range() -> None:
    zh = "第一句。第二句很长很长很长。第三句！"
    assert "".join(sentences(zh, "zh")) == zh
    rng = random.Random(1)
    for _ in range(20):
        out = lead(SECTION + " " + OTHER, "en", rng, (60, 200))
        assert out is None or 60 <= len(out) <= 200
