"""Reciprocal rank fusion: the formula, k, ties, bad input; mapping layer hits to chunks."""

from __future__ import annotations

import pytest

from memreader.core.fusion import LayerHit, fuse_layer_hits, reciprocal_rank_fusion


def test_rrf_scores_are_sums_of_reciprocal_ranks() -> None:
    fused = dict(reciprocal_rank_fusion([["a", "b", "c"], ["b", "a"]], k=60))
    assert fused["a"] == pytest.approx(1 / 61 + 1 / 62)
    assert fused["b"] == pytest.approx(1 / 62 + 1 / 61)
    assert fused["c"] == pytest.approx(1 / 63)


def test_rrf_k_trades_top_rank_against_agreement() -> None:
    # x is first in one list; y is third in two lists.
    rankings = [["x", "p", "y"], ["q", "r", "y"]]
    small_k = [key for key, _ in reciprocal_rank_fusion(rankings, k=0)]
    large_k = [key for key, _ in reciprocal_rank_fusion(rankings, k=60)]
    assert small_k.index("x") < small_k.index("y")  # 1/1 beats 1/3 + 1/3
    assert large_k.index("y") < large_k.index("x")  # 2/63 beats 1/61
    assert dict(reciprocal_rank_fusion(rankings, k=0))["x"] == 1.0


def test_rrf_ties_are_exact_and_broken_by_key() -> None:
    # a has ranks 1, 2, 7 and b ranks 7, 1, 2: summed naively in list order these terms differ in
    # the last bit; the fused scores must tie exactly, and the smaller key wins whichever way round
    # the lists are given.
    a, b = ("doc-b", 0), ("doc-a", 3)
    fill = [("f", i) for i in range(10)]
    rankings = [[a, *fill[:5], b], [b, a], [fill[5], b, *fill[6:10], a]]
    swapped = [[b if key == a else a if key == b else key for key in ranking] for ranking in rankings]
    for lists in (rankings, swapped, rankings[::-1]):
        fused = reciprocal_rank_fusion(lists, k=60)
        assert [key for key, _ in fused[:2]] == [("doc-a", 3), ("doc-b", 0)]
        assert fused[0][1] == fused[1][1]
    singles = reciprocal_rank_fusion([[("z", 0)], [("y", 0)], [("x", 0)]])
    assert [key for key, _ in singles] == [("x", 0), ("y", 0), ("z", 0)]


def test_rrf_edge_cases_and_bad_input() -> None:
    assert reciprocal_rank_fusion([]) == []
    assert reciprocal_rank_fusion([[], []]) == []
    with pytest.raises(ValueError, match="more than once"):
        reciprocal_rank_fusion([["a", "b", "a"]])
    with pytest.raises(ValueError, match="k must be"):
        reciprocal_rank_fusion([["a"]], k=-1)
    with pytest.raises(TypeError, match="orderable"):
        reciprocal_rank_fusion([[1], ["a"]])  # fails although the scores would not tie


def _hit(layer: str, rank: int, doc: str, scenario: int) -> LayerHit:
    return LayerHit(layer, rank, 0.5, doc, scenario, 10 * scenario, 10 * scenario + 10, f"{layer} text")


def test_fuse_layer_hits_maps_every_layer_to_its_chunk() -> None:
    outline = [_hit("outline", 1, "d", 2), _hit("outline", 2, "d", 0)]
    core = [_hit("core", 1, "d", 0), _hit("core", 2, "d", 2)]
    chunk = [_hit("chunk", 1, "e", 1), _hit("chunk", 2, "d", 2)]
    fused = fuse_layer_hits([outline, core, chunk], k=60)
    assert [key for key, _, _ in fused] == [("d", 2), ("d", 0), ("e", 1)]
    key, score, provenance = fused[0]
    assert [p.layer for p in provenance] == ["outline", "core", "chunk"]
    assert [p.rank for p in provenance] == [1, 2, 2]
    assert score == pytest.approx(1 / 61 + 2 / 62)
