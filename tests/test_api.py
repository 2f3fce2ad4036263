"""The Python API end to end (files → memories → index → answers) and the LangChain / LlamaIndex retrievers over
a real index, with the metadata each framework document carries."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from memreader import api
from memreader.core.errors import ConfigError
from memreader.core.paths import run_dir
from memreader.core.structure import annotate
from memreader.retrieval.search import format_hits
from tests.ingest.test_ingest import _pdf
from tests.retrieval.retrieval_samples import TEA, VOLCANO, make_memory

pytestmark = pytest.mark.integration

KILN = make_memory("pottery.pdf", [
    ("Firing pottery in a kiln", "Clay is fired at about 1000 °C to harden it into ceramic.",
     "Potters fire dried clay in a kiln at around a thousand degrees, which turns it into hard ceramic. "),
    ("Glazes", "A glaze melts into glass on the pot's surface during a second firing.",
     "A second, hotter firing melts the glaze into a thin layer of glass that seals the pot."),
])


def _annotated() -> Any:
    mem = copy.deepcopy(KILN)
    annotate(mem, {"source": "/data/pottery.pdf", "format": "pdf", "sha256": "0" * 64,
                   "pages": [[0, 1], [len(mem.chunks[0]), 2]],
                   "headings": [[0, ["Pottery"]], [len(mem.chunks[0]), ["Pottery", "Glazes"]]]})
    return mem


def test_files_to_answers_in_a_few_lines(tmp_path: Path, tiny_model: str, smollm2_path: str) -> None:
    from docx import Document as Docx

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "club.md").write_text("# Club\n\nThe garden club meets every Tuesday in the old hall.\n\n## Compost\n\n"
                                  "Members keep three compost bays behind the greenhouse.\n", encoding="utf-8")
    (docs / "trip.html").write_text("<html><body><h1>Trips</h1><p>The spring trip goes to the botanic garden in "
                                    "May.</p></body></html>", encoding="utf-8")
    _pdf(docs / "minutes.pdf", ["Minutes of March. The club voted to buy a new shredder for the compost.",
                                "Minutes of April. The shredder arrived and three members learned to use it."])
    word = Docx()
    word.add_heading("Rota", 1)
    word.add_paragraph("Each member waters the beds one week in turn, starting with the chair.")
    word.save(str(docs / "rota.docx"))
    corpus = api.ingest(docs, run="api")
    memories = api.read(corpus, run="api", model=tiny_model, backend="transformers", max_new_tokens=256,
                        min_chunk_chars=20, max_chunk_chars=200)
    assert sorted(m.doc_id for m in memories) == ["club.md", "minutes.pdf", "rota.docx", "trip.html"]
    minutes = next(m for m in memories if m.doc_id == "minutes.pdf")
    assert {p for entry in minutes.meta["structure"] for p in entry["pages"]} == {1, 2}
    assert all(m.chunks and "".join(m.chunks) == m.document for m in memories)  # guided: they tile exactly
    with api.index(memories, run="api", embedder="minilm-l6", device="cpu", verify=False) as index:
        assert index.built.plan.added == ["club.md", "minutes.pdf", "rota.docx", "trip.html"]
        hits = index.search("How many compost bays are there?", top_k=2, mode="hybrid")
        assert hits and all(h.text == next(m for m in memories if m.doc_id == h.doc_id).document[h.start:h.end]
                            for h in hits)
        assert all(h.where["source"] == str((docs / h.doc_id).resolve()) for h in hits)
        shredder = index.search("When did the shredder arrive?", top_k=8, mode="hybrid")
        pdf_hits = [h for h in shredder if h.doc_id == "minutes.pdf"]
        assert pdf_hits and all(h.where["pages"] for h in pdf_hits)
        assert f"p. {pdf_hits[0].where['pages'][0]}" in format_hits(pdf_hits)
        result = index.meve("How many compost bays are there?")  # MeVe's keys come with the index settings
        assert result.passages and result.audit["tokens"] <= 512
        page = index.audit_page("How many compost bays are there?", result, tmp_path / "meve.html").read_text("utf-8")
        assert "MeVe audit" in page and all(p.id in page for p in result.passages)
        page = index.audit_page("How many compost bays?", hits, tmp_path / "hits.html").read_text("utf-8")
        assert "Retrieval: layers" in page and "compost" in page
    viewed = api.view(run_dir("api", "read") / "memories.jsonl", tmp_path / "view.html")
    assert "club.md" in viewed.read_text(encoding="utf-8")
    again = api.index(memories, run="api", embedder="minilm-l6", device="cpu")  # unchanged: nothing re-embedded
    assert again.built.plan.unchanged == ["club.md", "minutes.pdf", "rota.docx", "trip.html"]
    assert again.built.scenarios == 0
    again.close()
    report = api.score(["three compost bays"], [["Members keep three compost bays."]])
    assert 0 < report.metrics["rouge_l"].value <= 1


def test_bad_settings_are_config_errors_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="top_k"):
        api.open_index(run="nothing-here", top_k=0)
    with pytest.raises(ConfigError, match="no texts given"):
        api.read_texts({})


@pytest.fixture(scope="module")
def opened(tmp_path_factory: pytest.TempPathFactory) -> Any:
    db = tmp_path_factory.mktemp("frameworks") / "index.db"
    index = api.index([_annotated(), VOLCANO, TEA], run="frameworks", db_path=str(db), embedder="minilm-l6",
                      device="cpu")
    yield index
    index.close()


def test_langchain_retriever_returns_chunks_with_outline_core_source_and_pages(opened: Any) -> None:
    from langchain_core.documents import Document

    from memreader.integrations.langchain import MemReaderRetriever

    retriever = MemReaderRetriever(index=opened, top_k=2, mode="hybrid")
    docs = retriever.invoke("What seals a pot?")
    assert all(isinstance(d, Document) for d in docs) and len(docs) == 2
    top = docs[0]
    assert top.page_content == KILN.chunks[1] and top.id == "pottery.pdf#1"
    meta = dict(top.metadata)
    assert meta.pop("score") > 0 and "chunk" in meta.pop("layers")
    assert meta == {"doc_id": "pottery.pdf", "scenario": 1, "start": KILN.scenarios[1].start,
                    "end": KILN.scenarios[1].end, "outline": "Glazes", "core": KILN.scenarios[1].core,
                    "source": "/data/pottery.pdf", "pages": [2], "headings": ["Pottery", "Glazes"]}
    volcano = retriever.invoke("How do scientists forecast an eruption?")[0]
    assert volcano.metadata["doc_id"] == VOLCANO.doc_id and volcano.metadata["source"] is None
    assert volcano.metadata["outline"] == VOLCANO.scenarios[2].outline  # fetched even when its row did not vote


def test_llamaindex_retriever_returns_scored_nodes_with_the_same_metadata(opened: Any) -> None:
    from llama_index.core.schema import NodeWithScore

    from memreader.integrations.llamaindex import MemReaderRetriever

    nodes = MemReaderRetriever(opened, top_k=3).retrieve("What seals a pot?")
    assert all(isinstance(n, NodeWithScore) for n in nodes) and len(nodes) == 3
    top = nodes[0]
    assert top.node.text == KILN.chunks[1] and top.node.id_ == "pottery.pdf#1"
    assert top.score == opened.search("What seals a pot?", top_k=3)[0].score  # MemReader's fused RRF score
    assert top.node.metadata["pages"] == [2] and top.node.metadata["core"] == KILN.scenarios[1].core
