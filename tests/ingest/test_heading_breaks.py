"""Headings end chunks: real HTML, Word and Markdown files through ``memreader ingest``, then the grammar the reader
builds from each record. Every section heading that the length range allows (not the one right under the title)
must end a chunk on every path of the grammar (``graph.breaks``), and the reader must record them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memreader.cli import main
from memreader.core.corpus import read_corpus
from memreader.core.markup import render_memory
from memreader.core.memory_grammar import BoundaryGraph
from memreader.core.schema import read_memories
from memreader.core.structure import structural_breaks
from memreader.inference.reader import ReadConfig, read_corpus_memories

TITLE = "Horn of Africa"
SECTIONS = {
    "History": ["The region was settled by pastoral communities thousands of years ago. Trade routes along the coast "
                "linked it to Arabia, Persia and India, and port towns grew rich on incense, ivory and gold.",
                "Sultanates rose and fell over the centuries, each leaving mosques, walls and a written record. "
                "European powers arrived late in the nineteenth century, a period remembered for colonialism."],
    "Somalia": ["Somalia became independent in 1960 when the former British and Italian territories united. The "
                "first decade saw competitive elections and a lively press, but also border wars.",
                "A military coup in 1969 brought a socialist government that launched a literacy campaign. Its "
                "collapse in 1991 left the country without a central authority for two decades."],
    "Economy": ["Livestock remains the backbone of the economy, with camels, goats and sheep exported across the "
                "Gulf. Remittances from the diaspora are larger than foreign aid.",
                "Telecommunications grew quickly in the absence of regulation, and mobile money is used more widely "
                "than in most rich countries. Fishing and farming along the two rivers have room to grow."],
    "Culture": ["Poetry holds a central place in Somali culture, and oral verse was used to debate politics long "
                "before newspapers existed. Music, theatre and storytelling draw on the same tradition.",
                "Family and clan ties decide much of social life, from marriage to the settlement of disputes, and "
                "hospitality to strangers is a point of honour."],
}


def _files(folder: Path) -> Path:
    from docx import Document as Docx

    folder.mkdir()
    html = [f"<html><head><title>{TITLE}</title></head><body><h1>{TITLE}</h1>"]
    md = [f"# {TITLE}\n"]
    word = Docx()
    word.add_heading(TITLE, 0)
    for heading, paras in SECTIONS.items():
        html.append(f"<h2>{heading}</h2>\n" + "".join(f"<p>{p}</p>\n" for p in paras))
        md.append(f"## {heading}\n\n" + "\n\n".join(paras) + "\n")
        word.add_heading(heading, 1)
        for p in paras:
            word.add_paragraph(p)
    (folder / "horn.html").write_text("\n".join(html) + "</body></html>", encoding="utf-8")
    (folder / "horn.md").write_text("\n".join(md), encoding="utf-8")
    word.save(str(folder / "horn.docx"))
    return folder


@pytest.fixture()
def corpus(tmp_path: Path, memreader_home: Path) -> Path:
    assert main(["ingest", str(_files(tmp_path / "docs")), "--set", "run=heads", "--set", "workers=1"]) == 0
    return memreader_home / "runs" / "heads" / "ingest" / "corpus.jsonl"


def test_every_section_heading_the_range_allows_ends_a_chunk(corpus: Path) -> None:
    cfg = ReadConfig(input=str(corpus))
    settings = cfg.grammar_settings(**cfg.marker())
    docs = read_corpus(corpus)
    assert sorted(d.meta["format"] for d in docs) == ["docx", "html", "markdown"]
    for doc in docs:
        breaks = structural_breaks(doc.meta)
        graph = BoundaryGraph.build(doc.text, settings, breaks)
        sections = [o for o, path in doc.meta["headings"] if len(path) == 2]
        assert [doc.text[o:].lstrip("# ")[:7] for o in sections] == ["History", "Somalia", "Economy", "Culture"]
        # the first section heading sits right under the title: no chunk of min_chars fits before it
        assert sections[0] < graph.min_chars
        allowed = sections[1:]
        assert all(b - a >= graph.min_chars for a, b in zip(allowed, [*allowed[1:], len(doc.text)], strict=True))
        assert graph.breaks == allowed, doc.doc_id  # kept: no chunk of any path crosses them
        for s, ends in graph.edges.items():
            assert not any(s < b < e for b in allowed for e in ends), (doc.doc_id, s, ends)
        assert set(allowed) <= set(graph.edges)  # each is reached, and a chunk starts there


class Backend:
    """A scripted reader: two halves (the reader records the grammar it would have sent)."""

    def __init__(self) -> None:
        self.grammars: list[str | None] = []

    def generate_many(self, list_of_messages, params, progress_desc=None, on_reply=None, return_exceptions=False,
                      grammars=None):
        self.grammars += list(grammars or [None] * len(list_of_messages))
        outs = []
        for msgs in list_of_messages:
            doc = msgs[-1]["content"].split("<document>\n", 1)[1].rsplit("\n</document>", 1)[0]
            cut = doc.index(" ", len(doc) // 2)
            outs.append(render_memory(["x", "y"], [doc[:cut], doc[cut:]], ["c", "d"]))
        return outs


def test_the_reader_passes_the_heading_breaks_of_every_format(corpus: Path, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    backend = Backend()
    summary = read_corpus_memories(ReadConfig(input=str(corpus), run="heads", batch_size=3), backend=backend)
    assert summary["read"] == 3 and all(backend.grammars)
    for mem in read_memories(summary["memories"]):
        assert mem.meta["generation"]["grammar"]["breaks"] == 3, mem.doc_id  # Somalia, Economy, Culture


@pytest.mark.integration
def test_a_guided_read_ends_chunks_at_the_headings(corpus: Path, tmp_path, tiny_model, monkeypatch) -> None:
    """The real guided path on a random 2-layer model: whatever it picks, its chunks end at the section starts (one
    document, the Word file: the test above covers every format's breaks)."""
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    cfg = ReadConfig(input=str(corpus), run="heads-tiny", model=tiny_model, backend="transformers",
                     max_new_tokens=300, core_tokens=8, topic_tokens=6, limit=1)
    summary = read_corpus_memories(cfg)
    assert summary["guided"] == 1 and summary["fallback_whole_document"] == 0
    docs = {d.doc_id: d for d in read_corpus(corpus)}
    for mem in read_memories(summary["memories"]):
        starts = {sc.start for sc in mem.scenarios}
        sections = [o for o, path in docs[mem.doc_id].meta["headings"] if len(path) == 2]
        assert set(sections[1:]) <= starts, (mem.doc_id, sorted(starts), sections)
        assert mem.meta["alignment"]["coverage_exact"] == 1.0, json.dumps(mem.meta)[:300]
