"""memreader ingest: every format into a corpus with its page and heading maps, bad files reported one by one,
reruns that skip unchanged files, and the configuration errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memreader.cli import main
from memreader.core.corpus import CorpusError, read_corpus
from memreader.core.structure import headings_at, page_at
from memreader.ingest.formats import extract

PAGES = ["Compost bays hold garden waste for a season.", "The club meets every week in the old hall.",
         "Members bring notes and share them after the meeting."]


def _pdf(path: Path, pages: list[str]) -> Path:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("Helvetica", size=12)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 8, text)
    pdf.output(str(path))
    return path


def _folder(root: Path) -> Path:
    from docx import Document as Docx
    from pypdf import PdfReader, PdfWriter

    docs = root / "docs"
    (docs / "web").mkdir(parents=True)
    _pdf(docs / "report.pdf", PAGES)
    locked = PdfWriter()
    for page in PdfReader(docs / "report.pdf").pages:
        locked.add_page(page)
    locked.encrypt(user_password="secret", owner_password="owner")
    locked.write(docs / "locked.pdf")
    scan = PdfWriter()
    scan.add_blank_page(width=200, height=200)
    scan.write(docs / "scan.pdf")
    (docs / "broken.pdf").write_bytes(b"%PDF-1.4\nthis is not a pdf body at all\n")
    word = Docx()
    word.add_heading("Guide", 0)
    word.add_paragraph("Read this first.")
    word.add_heading("Install", 1)
    word.add_paragraph("Run make setup.")
    table = word.add_table(rows=1, cols=2)
    table.rows[0].cells[0].text, table.rows[0].cells[1].text = "step", "command"
    word.save(str(docs / "guide.docx"))
    (docs / "web" / "page.html").write_text(
        "<html><head><title>t</title><script>alert('x')</script></head><body><h1>Garden</h1><p>Bays and beds.</p>"
        "<h2>Tools</h2><ul><li>Spade</li><li>Fork</li></ul><div>Loose text <b>bold</b></div></body></html>",
        encoding="utf-8")
    (docs / "notes.md").write_text("# Club\n\nWe meet weekly.\n\n## Trips\n\nA trip in May.\n", encoding="utf-8")
    (docs / "plain.txt").write_text("Just words.\n", encoding="utf-8")
    (docs / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    (docs / "photo.png").write_bytes(b"\x89PNG\r\n")
    (docs / "more.jsonl").write_text(json.dumps({"id": "rec-1", "text": "A record."}) + "\n", encoding="utf-8")
    return docs


def _records(home: Path, run: str) -> dict[str, dict]:
    path = home / "runs" / run / "ingest" / "corpus.jsonl"
    return {r["id"]: r for r in map(json.loads, path.read_text(encoding="utf-8").splitlines())}


@pytest.mark.heavy
def test_every_format_with_pages_and_headings(tmp_path: Path, memreader_home: Path, capsys) -> None:
    docs = _folder(tmp_path)
    assert main(["ingest", str(docs), "--set", "run=ing", "--set", "workers=2"]) == 0
    out = capsys.readouterr().out
    recs = _records(memreader_home, "ing")
    assert set(recs) == {"report.pdf", "guide.docx", "web/page.html", "notes.md", "plain.txt", "rec-1"}
    pdf = recs["report.pdf"]
    assert [p for _, p in pdf["pages"]] == [1, 2, 3] and pdf["format"] == "pdf"
    for (offset, _), text in zip(pdf["pages"], PAGES, strict=True):
        assert pdf["text"][offset:].startswith(text)
    assert page_at(pdf["pages"], pdf["text"].index("old hall")) == 2
    md = recs["notes.md"]
    assert md["text"] == (docs / "notes.md").read_text(encoding="utf-8")  # Markdown stays as written
    assert md["headings"] == [[0, ["Club"]], [md["text"].index("## Trips"), ["Club", "Trips"]]]
    html = recs["web/page.html"]
    assert "alert" not in html["text"] and "Spade\n\nFork" in html["text"] and "Loose text" in html["text"]
    assert headings_at(html["headings"], html["text"].index("Fork")) == ["Garden", "Tools"]
    word = recs["guide.docx"]
    assert [h for _, h in word["headings"]] == [["Guide"], ["Guide", "Install"]] and "step | command" in word["text"]
    assert recs["rec-1"]["format"] == "jsonl" and recs["plain.txt"]["sha256"]
    report = json.loads((memreader_home / "runs" / "ing" / "ingest" / "report.json").read_text())
    fates = {k: v["fate"] for k, v in report["files"].items()}
    assert fates["locked.pdf"] == "encrypted" and fates["scan.pdf"] == "no-text" and fates["broken.pdf"] == "corrupt"
    assert fates["photo.png"] == "unsupported" and fates["latin.txt"] == "encoding"
    assert "no text layer" in out and "run OCR first" in out and "decrypt it first" in out
    assert f"{docs / 'photo.png'}: unsupported file type '.png'" in out  # named, not only counted
    assert read_corpus(memreader_home / "runs" / "ing" / "ingest" / "corpus.jsonl")[0].meta["source"]


PAGE = """<html><head><title>Compost</title></head><body>
<header><a href="/">Home</a> | <a href="/about">About</a> | <a href="/subscribe">Subscribe now!</a></header>
<nav><ul><li><a href="/a">All articles</a></li><li><a href="/b">Archive</a></li></ul></nav>
<div class="breadcrumb"><a href="/">Garden</a> &gt; <a href="/soil">Soil</a></div>
<form action="/search"><label>Search the site</label><input name="q"><button>Go</button></form>
<article>
  <header><h1>Compost at home</h1><p>By the garden club</p></header>
  <p>Compost turns kitchen scraps and leaves into soil.</p>
  <h2>Bays</h2>
  <p>Three bays sit behind the greenhouse.</p>
  <aside><p>Note: keep the bays damp.</p></aside>
  <h2>Turning</h2>
  <p>Turn the piles every month.</p>
</article>
<aside role="complementary"><h3>Popular posts</h3><a href="/p">Ten tools</a></aside>
<div role="contentinfo">Site map and contact.</div>
<footer>Copyright 2026. Cookie settings.</footer>
</body></html>"""


def test_html_keeps_the_article_and_drops_the_page_furniture(tmp_path: Path, memreader_home: Path) -> None:
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "compost.html").write_text(PAGE, encoding="utf-8")
    assert main(["ingest", str(tmp_path / "web"), "--set", "run=furniture"]) == 0
    rec = _records(memreader_home, "furniture")["compost.html"]
    text = rec["text"]
    for furniture in ("Home", "Subscribe", "All articles", "Archive", "Garden >", "Search the site", "Go",
                      "Popular posts", "Ten tools", "Site map", "Copyright", "Cookie"):
        assert furniture not in text, furniture
    assert text.startswith("Compost at home\n\nBy the garden club\n\nCompost turns kitchen scraps")
    assert "Note: keep the bays damp." in text and text.endswith("Turn the piles every month.")
    heads = {path[-1]: offset for offset, path in rec["headings"]}
    assert [path for _, path in rec["headings"]] == [["Compost at home"], ["Compost at home", "Bays"],
                                                      ["Compost at home", "Turning"]]
    assert all(text[offset:].startswith(head) for head, offset in heads.items())


@pytest.mark.heavy
def test_reruns_skip_unchanged_files_update_changed_and_drop_removed(tmp_path, memreader_home, capsys) -> None:
    docs = tmp_path / "d"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n\nalpha\n", encoding="utf-8")
    (docs / "b.txt").write_text("beta\n", encoding="utf-8")
    assert main(["ingest", str(docs), "--set", "run=re"]) == 0
    assert main(["ingest", str(docs), "--set", "run=re"]) == 0
    assert "2 unchanged" in capsys.readouterr().out
    (docs / "a.md").write_text("# A\n\nalpha, again\n", encoding="utf-8")
    (docs / "b.txt").unlink()
    assert main(["ingest", str(docs), "--set", "run=re"]) == 0
    assert "1 updated" in capsys.readouterr().out
    recs = _records(memreader_home, "re")
    assert set(recs) == {"a.md"} and "again" in recs["a.md"]["text"]


def test_nothing_ingestable_and_configuration_errors(tmp_path: Path, memreader_home: Path, capsys) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.png").write_bytes(b"\x89PNG")
    assert main(["ingest", str(bad), "--set", "run=none"]) == 1
    assert "nothing could be ingested" in capsys.readouterr().err
    assert main(["ingest", str(tmp_path / "missing"), "--set", "run=none"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["ingest", "--set", "run=none"]) == 2
    assert "name at least one file" in capsys.readouterr().err
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "same.md").write_text(f"# {name}\n", encoding="utf-8")
    assert main(["ingest", str(tmp_path / "one"), str(tmp_path / "two"), "--set", "run=dup"]) == 2
    err = capsys.readouterr().err
    assert "two files map to the id 'same.md'" in err and "one/same.md" in err and "two/same.md" in err


def test_a_pdf_given_as_a_corpus_is_sent_to_ingest(tmp_path: Path) -> None:
    path = _pdf(tmp_path / "report.pdf", PAGES[:1])
    with pytest.raises(CorpusError, match="memreader ingest"):
        read_corpus(path)
    assert extract(path).pages == [(0, 1)]


def test_memories_keep_the_pages_and_headings_of_each_scenario(tmp_path: Path, memreader_home: Path) -> None:
    from memreader.core.schema import DocumentMemory, Scenario
    from memreader.core.structure import annotate, where

    path = _pdf(tmp_path / "report.pdf", PAGES)
    assert main(["ingest", str(path), "--set", "run=st"]) == 0
    (doc,) = read_corpus(memreader_home / "runs" / "st" / "ingest" / "corpus.jsonl")
    starts = [o for o, _ in doc.meta["pages"]]
    cut = starts[1] + 5  # the second scenario starts inside page 2 and runs to the end of page 3
    memory = DocumentMemory(doc.doc_id, doc.text, [Scenario("a", "", 0, cut), Scenario("b", "", cut, len(doc.text))])
    annotate(memory, {**doc.meta, "headings": [[0, ["Report"]], [cut + 1, ["Report", "Later"]]]})
    assert memory.meta["source"]["format"] == "pdf" and memory.meta["source"]["source"].endswith("report.pdf")
    assert where(memory, 0) == {"source": str(path.resolve()), "pages": [1, 2], "headings": ["Report"]}
    assert where(memory, 1)["pages"] == [2, 3] and where(memory, 1)["headings"] == ["Report"]
    plain = DocumentMemory("x", "text", [Scenario("a", "", 0, 4)])
    assert annotate(plain, {"domain": "news"}).meta == {}  # a corpus without maps: nothing added
