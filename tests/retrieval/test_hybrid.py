"""Hybrid retrieval (dense + Milvus BM25, fused with RRF) on Milvus Lite with the real MiniLM embedder.

The corpus is a parts catalogue where every entry names a look-alike part number (QZ-7718,
QZ-7187, ...): MiniLM embeds those numbers alike, so the one entry that holds the asked-for number
QZ-7781 — and talks about a kettle rather than pumps and valves — ranks 11th of 12 by vector
similarity, while BM25 ranks it first on the rare term ``7781``. Hybrid modes must find it in the
top 4; dense-only must not.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memreader.core.fusion import Hit, LayerHit, rank_hits, split_by_layer
from memreader.retrieval.index import MODES, MemoryIndex
from memreader.retrieval.search import format_hits
from tests.retrieval.retrieval_samples import make_memory

PARTS = [
    ("Seal for the feed pump", "QZ-7718 seals the feed pump.",
     "Part QZ-7718 is the replacement seal that fits the feed pump of the 2004 boiler series. "),
    ("Circulation pump seal", "QZ-7187 fits the circulation pump.",
     "Part QZ-7187 fits the circulation pump housing; order it when the pump seal weeps. "),
    ("Heat pump impeller", "QZ-1778 is a heat pump impeller.",
     "Part QZ-1778 is the pump impeller that fits all heat pumps built after 2010. "),
    ("Relief valve part", "QZ-8771 fits the relief valve.",
     "Part QZ-8771 fits the pressure relief valve of the wall-hung boiler range. "),
    ("Drain valve washer", "QZ-7817 is the drain valve washer.",
     "Part QZ-7817 is the drain valve washer that fits the hot water cylinder. "),
    ("Expansion vessel part", "QZ-7178 fits the expansion vessel.",
     "Part QZ-7178 fits the expansion vessel; replace it when the pressure drops. "),
    ("Thermostat probe", "QZ-1877 is the boiler thermostat probe.",
     "Part QZ-1877 is the thermostat probe that fits the boiler control board. "),
    ("Shipping of spare parts", "Pump and valve parts ship in two days.",
     "Replacement parts for pumps and valves ship within two days of the order. "),
    ("Kettle descaler lid ring", "QZ-7781 is the ring under the kettle descaler lid.",
     "The rubber ring QZ-7781 sits under the lid of the 1998 kettle descaler and stops steam escaping. "),
    ("Flue gas sensor", "QZ-7871 fits the flue gas sensor.",
     "Part QZ-7871 fits the flue gas sensor of the condensing boiler range. "),
    ("Ignition electrode", "QZ-8177 is the burner ignition electrode.",
     "Part QZ-8177 is the ignition electrode that fits the gas burner. "),
    ("Magnetic filter part", "QZ-7711 fits the magnetic filter.",
     "Part QZ-7711 fits the magnetic filter on the return pipe of the heating circuit."),
]
# Three catalogue pages of four entries each; the asked-for entry is page 2, scenario 0.
PAGES = [make_memory(f"catalogue-{p}", PARTS[4 * p : 4 * p + 4]) for p in range(3)]
TARGET = ("catalogue-2", 0)
QUESTION = "Where does part QZ-7781 go?"
TOP_K = 4


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory: pytest.TempPathFactory, embedder: Any) -> Iterator[MemoryIndex]:
    """The catalogue in a Milvus Lite index with the English BM25 analyzer."""
    db: Path = tmp_path_factory.mktemp("hybrid") / "catalogue.db"
    with MemoryIndex(db, embedder=embedder) as index:
        index.build(PAGES, embedder, embedder_name="minilm-l6", progress=False, bm25_language="en")
        yield index


def _rrf(hit: Hit, k: float = 60) -> float:
    return math.fsum(1 / (k + p.rank) for p in hit.provenance)


def _keys(hits: list[Hit]) -> list[tuple[str, int]]:
    return [(h.doc_id, h.scenario) for h in hits]


@pytest.mark.integration
def test_bm25_finds_the_rare_part_number_that_dense_ranks_last(catalogue: MemoryIndex) -> None:
    vector = catalogue.embed_query(QUESTION)
    dense = catalogue.search_layer(vector, "chunk", limit=len(PARTS))
    assert _keys(dense).index(TARGET) >= 2 * TOP_K  # 11th of 12: look-alike numbers and pump talk win
    bm25 = catalogue.search_bm25(QUESTION, "chunk", limit=TOP_K)
    assert bm25[0].key == TARGET and bm25[0].layer == "chunk/bm25" and bm25[0].signal == "bm25"
    assert [h.rank for h in bm25] == list(range(1, len(bm25) + 1))
    assert all(h.similarity > 0 for h in bm25)
    assert [h.similarity for h in bm25] == sorted((h.similarity for h in bm25), reverse=True)


@pytest.mark.integration
def test_hybrid_modes_find_what_dense_only_misses(catalogue: MemoryIndex) -> None:
    assert TARGET not in _keys(catalogue.search(QUESTION, top_k=TOP_K, mode="chunk_only"))
    assert TARGET not in _keys(catalogue.search(QUESTION, top_k=TOP_K, mode="three_layer"))
    chunk_hybrid = catalogue.search(QUESTION, top_k=TOP_K, mode="chunk_hybrid")
    target = next(h for h in chunk_hybrid if (h.doc_id, h.scenario) == TARGET)
    # Only the chunk BM25 list voted for it, at rank 1: RRF gives exactly 1 / (60 + 1).
    assert [(p.layer, p.rank) for p in target.provenance] == [("chunk/bm25", 1)]
    assert target.score == 1 / 61
    # In hybrid mode the core BM25 list (the core names the part too) votes as well.
    hybrid = catalogue.search(QUESTION, top_k=TOP_K, mode="hybrid")
    top = hybrid[0]
    assert (top.doc_id, top.scenario) == TARGET
    assert {"chunk/bm25", "core/bm25"} <= set(top.layers)
    assert top.text == PAGES[2].document[top.start : top.end]


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["hybrid", "chunk_hybrid"])
def test_fused_scores_are_rrf_sums_with_deterministic_order(catalogue: MemoryIndex, mode: str) -> None:
    hits = catalogue.search(QUESTION, top_k=TOP_K, mode=mode, rrf_k=60)
    assert len(hits) == TOP_K
    for hit in hits:
        assert hit.score == _rrf(hit)  # exact: the fusion sums with math.fsum in the same way
        assert set(hit.layers) <= set(MODES[mode])
        assert len(set(hit.layers)) == len(hit.layers)  # one vote per list
    # Best first; equal scores ordered by (doc_id, scenario).
    assert [(-h.score, h.doc_id, h.scenario) for h in hits] == sorted((-h.score, h.doc_id, h.scenario) for h in hits)
    # The same query gives the same hits, and one search per layer gives the same as one batched search.
    again = catalogue.search(QUESTION, top_k=TOP_K, mode=mode, rrf_k=60)
    catalogue.batch_layers = False
    try:
        per_layer = catalogue.search(QUESTION, top_k=TOP_K, mode=mode, rrf_k=60)
    finally:
        catalogue.batch_layers = True
    assert [h.to_dict() for h in again] == [h.to_dict() for h in hits] == [h.to_dict() for h in per_layer]
    with_k0 = catalogue.search(QUESTION, top_k=TOP_K, mode=mode, rrf_k=0)
    assert all(h.score == math.fsum(1 / p.rank for p in h.provenance) for h in with_k0)


@pytest.mark.integration
def test_bm25_provenance_is_labelled_in_dict_and_text(catalogue: MemoryIndex) -> None:
    hits = catalogue.search(QUESTION, top_k=TOP_K, mode="hybrid")
    provenance = [p for h in hits for p in h.to_dict()["provenance"]]
    assert {p["signal"] for p in provenance} == {"dense", "bm25"}
    assert all(p["layer"].endswith("/bm25") == (p["signal"] == "bm25") for p in provenance)
    rendered = format_hits(hits)
    assert "chunk/bm25 #1 (bm25 " in rendered
    assert "> core: QZ-7781 is the ring under the kettle descaler lid." in rendered
    # A core text is shown once per hit that a core list voted for, even when both core lists did.
    assert rendered.count("> core:") == sum(any(p.base_layer == "core" for p in h.provenance) for h in hits)
    assert any({"core", "core/bm25"} <= set(h.layers) for h in hits)


@pytest.mark.integration
def test_query_without_a_term_gives_no_bm25_votes(catalogue: MemoryIndex) -> None:
    for layer in ("outline", "core", "chunk"):
        assert catalogue.search_bm25("?! ... ？", layer, limit=5) == []
    hits = catalogue.search("?!", top_k=3, mode="hybrid")  # the dense lists still answer
    assert len(hits) == 3
    assert all(p.signal == "dense" for h in hits for p in h.provenance)
    with pytest.raises(ValueError, match="text layer"):
        catalogue.search_bm25(QUESTION, "single", limit=3)
    with pytest.raises(ValueError, match="no bm25 list for layer 'single'"):
        catalogue.search_lists(QUESTION, ["single/bm25"], limit=3)
    with pytest.raises(ValueError, match="query is empty"):
        catalogue.search("   ", mode="chunk_hybrid")


@pytest.mark.integration
@pytest.mark.parametrize("depth", [1, 4])
def test_batched_layer_search_gives_each_layers_exact_top_k(
    catalogue: MemoryIndex, monkeypatch: pytest.MonkeyPatch, depth: int
) -> None:
    """One Milvus search over all layers, split per layer, equals one search per layer — also when
    the batched answer is too shallow for a layer (depth 1) and that layer falls back to its own."""
    monkeypatch.setattr(catalogue, "union_depth", depth)  # the index's own setting (the module constant is its default)
    fallbacks: list[str] = []
    search_layer, search_bm25 = catalogue.search_layer, catalogue.search_bm25

    def counted(search: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            if catalogue.batch_layers:
                fallbacks.append(args[1])  # the layer that needed its own search
            return search(*args, **kwargs)
        return run

    monkeypatch.setattr(catalogue, "search_layer", counted(search_layer))
    monkeypatch.setattr(catalogue, "search_bm25", counted(search_bm25))
    labels = MODES["hybrid"]
    try:
        for query in (QUESTION, "boiler pump seal", "kettle steam", "valve"):
            for limit in (1, 2, 5, 12):
                catalogue.batch_layers = True
                batched = catalogue.search_lists(query, labels, limit)
                catalogue.batch_layers = False
                one_each = catalogue.search_lists(query, labels, limit)
                assert batched == one_each, (query, limit)
    finally:
        catalogue.batch_layers = True
    if depth == 1:
        assert fallbacks  # the shallow batched answer really sent some layers to their own search


def _row(layer: str, score: float, doc: str, scenario: int = 0) -> LayerHit:
    return LayerHit(layer, 0, score, doc, scenario, 0, 1, "t")


def test_split_by_layer_keeps_only_what_the_cut_proves_complete() -> None:
    union = [_row("chunk", 0.9, "a"), _row("core", 0.8, "b"), _row("chunk", 0.7, "c"), _row("core", 0.7, "d"),
             _row("outline", 0.6, "e"), _row("chunk", 0.6, "f")]
    # Asked for 6 and got 6: rows left out score <= 0.6, so only rows above 0.6 are proven best.
    split = split_by_layer(union, ["outline", "core", "chunk"], limit=2, asked=6)
    assert split["outline"] is None  # its one row ties the cut: its own search decides
    assert [(h.doc_id, h.rank) for h in split["core"] or []] == [("b", 1), ("d", 2)]
    assert [(h.doc_id, h.rank) for h in split["chunk"] or []] == [("a", 1), ("c", 2)]
    # A shorter answer than asked for left nothing out: every layer is complete, however short.
    short = split_by_layer(union, ["outline", "core", "chunk"], limit=2, asked=7)
    assert [h.doc_id for h in short["outline"] or []] == ["e"]
    assert split_by_layer([], ["chunk"], limit=3, asked=9) == {"chunk": []}


def test_rank_hits_breaks_ties_by_key() -> None:
    hits = [_row("chunk", 0.5, "b", 1), _row("chunk", 0.5, "a", 2), _row("chunk", 0.5, "a", 1), _row("chunk", 0.9, "z")]
    ranked = rank_hits(hits, limit=3)
    assert [(h.doc_id, h.scenario, h.rank) for h in ranked] == [("z", 0, 1), ("a", 1, 2), ("a", 2, 3)]
    assert rank_hits(reversed(hits), limit=3) == ranked
