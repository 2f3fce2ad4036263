"""Segmentation against gold boundaries: boundary P/R/F1 with a tolerance, Pk and WindowDiff (hand-worked cases and
a brute-force cross-check), outline agreement, the gold loader's errors, scoring memories files, the `memreader eval`
path (rule chunkers only) and the bench script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memreader.core.schema import DocumentMemory, Scenario, write_memories
from memreader.eval.chunkers import chunks_as_memory
from memreader.eval.datasets import DatasetError
from memreader.eval.gold_segments import GoldDocument, GoldMismatchError, load_gold_segments, score_memories
from memreader.eval.segmentation import (
    SegmentationSettings,
    aggregate,
    default_window,
    match_boundaries,
    outline_agreement,
    pk,
    prf,
    score_document,
    window_diff,
)

REPO = Path(__file__).resolve().parents[2]
GOLD = REPO / "tests" / "eval" / "assets" / "gold_segments_small.jsonl"


# --- Pk and WindowDiff: hand-worked ---------------------------------------------------------------------------


def test_pk_and_window_diff_hand_worked() -> None:
    # n = 10 units, gold boundary at 5 (segments [0,5) [5,10)), prediction at 6, k = 2: probes i = 0..7 (8 of them).
    # gold: i and i+2 straddle 5 for i in {3, 4}; prediction: straddle 6 for i in {4, 5} -> disagree at i = 3, 5.
    assert pk([6], [5], 10, k=2) == pytest.approx(2 / 8)
    # boundary counts in (i, i+2]: gold 1 at i = 3, 4; prediction 1 at i = 4, 5 -> differ at i = 3, 5.
    assert window_diff([6], [5], 10, k=2) == pytest.approx(2 / 8)
    # default k: mean gold segment 10 / 2 = 5, half of it 2.5, rounded half up -> 3; probes i = 0..6 (7).
    assert default_window([5], 10) == 3
    # gold straddles for i in {2, 3, 4}, prediction for i in {3, 4, 5} -> disagree at i = 2, 5.
    assert pk([6], [5], 10) == pytest.approx(2 / 7)
    assert window_diff([6], [5], 10) == pytest.approx(2 / 7)


def test_window_diff_penalises_an_extra_near_boundary_more_than_pk() -> None:
    # gold {5}, prediction {5, 6}, k = 3, probes i = 0..6.
    # Pk: gold straddles for i in {2, 3, 4}, prediction for i in {2, 3, 4, 5} -> only i = 5 disagrees: 1/7.
    assert pk([5, 6], [5], 10, k=3) == pytest.approx(1 / 7)
    # WindowDiff: counts in (i, i+3]: gold 1,1,1 at i = 2,3,4; prediction 1,2,2,1 at i = 2,3,4,5 -> differ at
    # i = 3 (1 vs 2), 4 (1 vs 2), 5 (0 vs 1): 3/7.
    assert window_diff([5, 6], [5], 10, k=3) == pytest.approx(3 / 7)


def test_identical_missing_and_empty_segmentations() -> None:
    assert pk([3, 7], [3, 7], 10) == 0.0 and window_diff([3, 7], [3, 7], 10) == 0.0
    assert pk([], [], 10) == 0.0 and window_diff([], [], 10) == 0.0
    # no predicted boundary against gold {5}, k = 3: gold straddles for i in {2, 3, 4} of 7 probes
    assert pk([], [5], 10) == pytest.approx(3 / 7) and window_diff([], [5], 10) == pytest.approx(3 / 7)
    assert pk([], [], 1) == 0.0  # one character: no probe, no boundary
    assert pk([2], [2], 4, k=50) == 0.0  # a fixed k past a short text is cut to n - 1
    with pytest.raises(ValueError, match="outside"):
        pk([10], [5], 10)
    with pytest.raises(ValueError, match="strictly increasing"):
        window_diff([6, 4], [5], 10)


def _segment_of(boundaries: list[int], i: int) -> int:
    return sum(b <= i for b in boundaries)


def _brute(pred: list[int], gold: list[int], n: int, k: int) -> tuple[float, float]:
    """Pk and WindowDiff straight from their definitions, O(n * k)."""
    probes = range(n - k)
    pk_miss = sum((_segment_of(gold, i) == _segment_of(gold, i + k)) != (_segment_of(pred, i) == _segment_of(pred, i + k))
                  for i in probes)
    wd_miss = sum(sum(i < b <= i + k for b in gold) != sum(i < b <= i + k for b in pred) for i in probes)
    return pk_miss / (n - k), wd_miss / (n - k)


@st.composite
def _case(draw: st.DrawFn) -> tuple[list[int], list[int], int, int]:
    n = draw(st.integers(2, 80))
    inner = st.sets(st.integers(1, n - 1), max_size=min(12, n - 1))
    k = draw(st.integers(1, n - 1))
    return sorted(draw(inner)), sorted(draw(inner)), n, k


@settings(max_examples=300, deadline=None)
@given(_case())
def test_pk_and_window_diff_agree_with_brute_force(case: tuple[list[int], list[int], int, int]) -> None:
    pred, gold, n, k = case
    want_pk, want_wd = _brute(pred, gold, n, k)
    assert pk(pred, gold, n, k) == pytest.approx(want_pk)
    assert window_diff(pred, gold, n, k) == pytest.approx(want_wd)
    assert window_diff(pred, gold, n, k) >= pk(pred, gold, n, k)  # every Pk miss is a WindowDiff miss
    default = default_window(gold, n)
    assert pk(pred, gold, n) == pytest.approx(_brute(pred, gold, n, min(default, n - 1))[0])


# --- boundary matching and P/R/F1 ----------------------------------------------------------------------------


def test_matching_is_one_to_one_and_maximal() -> None:
    # gold {2, 4}, predictions {3, 5}, tolerance 1: 3 reaches both gold boundaries; greedy by distance with the
    # wrong tie-break pairs 3-4 and leaves 2 and 5 alone; the sweep pairs 3-2 and 5-4.
    assert match_boundaries([3, 5], [2, 4], 1) == [(3, 2), (5, 4)]
    assert match_boundaries([10, 11], [10], 3) == [(10, 10)]  # one gold boundary takes one prediction
    assert match_boundaries([14], [10], 3) == []  # 4 characters off: no match
    assert match_boundaries([13], [10], 3) == [(13, 10)]


def _max_matching(pred: list[int], gold: list[int], tol: int) -> int:
    """Maximum bipartite matching by augmenting paths (Kuhn): an independent count for the sweep."""
    owner: dict[int, int] = {}

    def augment(g: int, seen: set[int]) -> bool:
        for p in range(len(pred)):
            if abs(pred[p] - gold[g]) <= tol and p not in seen:
                seen.add(p)
                if p not in owner or augment(owner[p], seen):
                    owner[p] = g
                    return True
        return False

    return sum(augment(g, set()) for g in range(len(gold)))


@settings(max_examples=300, deadline=None)
@given(st.sets(st.integers(1, 60), max_size=10), st.sets(st.integers(1, 60), max_size=10), st.integers(0, 5))
def test_matching_size_equals_a_maximum_matching(pred: set[int], gold: set[int], tol: int) -> None:
    pairs = match_boundaries(sorted(pred), sorted(gold), tol)
    assert len(pairs) == _max_matching(sorted(pred), sorted(gold), tol)
    assert all(abs(p - g) <= tol for p, g in pairs)
    assert len({p for p, _ in pairs}) == len(pairs) == len({g for _, g in pairs})


def test_precision_recall_f1_conventions() -> None:
    assert prf(0, 0, 0) == (1.0, 1.0, 1.0)  # nothing to find, nothing predicted
    assert prf(0, 0, 3) == (0.0, 0.0, 0.0)
    assert prf(0, 2, 0) == (0.0, 0.0, 0.0)
    p, r, f = prf(1, 2, 4)
    assert (p, r) == (0.5, 0.25) and f == pytest.approx(2 * 0.5 * 0.25 / 0.75)


# --- documents, outlines, aggregates --------------------------------------------------------------------------

TEXT = "The town sits on the coast. It was founded in 1712. Fishing is the main trade now."
CUTS = [TEXT.index("It was"), TEXT.index("Fishing")]


def _memory(starts: list[int], outlines: list[str] | None = None, text: str = TEXT) -> DocumentMemory:
    cuts = [0, *starts, len(text)]
    outlines = outlines or [""] * (len(cuts) - 1)
    return DocumentMemory("d", text, [Scenario(o, "", a, b) for o, a, b in zip(outlines, cuts, cuts[1:], strict=False)])


def test_a_boundary_before_the_separator_matches_within_the_tolerance() -> None:
    # the aligner may leave the space to the next chunk: one character early still matches at tolerance 3
    doc = score_document(_memory([c - 1 for c in CUTS]), CUTS)
    assert (doc.matched, doc.precision, doc.recall, doc.f1) == (2, 1.0, 1.0, 1.0)
    strict = score_document(_memory([c - 1 for c in CUTS]), CUTS, settings=SegmentationSettings(tolerance=0))
    assert strict.matched == 0 and strict.f1 == 0.0 and strict.pk > 0
    exact = score_document(_memory(CUTS), CUTS)
    assert (exact.pk, exact.window_diff, exact.chunks, exact.mean_chunk_chars) == (0.0, 0.0, 3, len(TEXT) / 3)


def test_outline_agreement_pairs_each_gold_segment_with_its_most_overlapping_scenario() -> None:
    titles = ["The town", "Founding", "Trade"]
    assert outline_agreement(_memory(CUTS, ["the town", "founding", "trade"]), CUTS, titles) == pytest.approx(1.0)
    # predicted chunks: [0, 10) "The town s", [10, end): the second overlaps all three gold segments most
    mem = _memory([10], ["Coast", "Founding"])
    # gold 1 [0, 28) overlaps scenario 0 by 10, scenario 1 by 18 -> "Founding" vs "The town": 0
    # gold 2 and 3 -> "Founding": 1 and 0 -> mean 1/3
    assert outline_agreement(mem, CUTS, titles) == pytest.approx(1 / 3)
    assert outline_agreement(mem, CUTS, None) is None  # gold without titles
    chunk_only = chunks_as_memory("d", TEXT, [(0, CUTS[0]), (CUTS[0], len(TEXT))], "fixed")
    assert outline_agreement(chunk_only, CUTS, titles) is None  # the rule chunkers write no outline: None, not 0
    zh = "青岚茶园位于山区。茶园始建于一九五六年。"
    cut = zh.index("茶园始")
    half = outline_agreement(_memory([cut], ["茶园位置", "建园历史"], zh), [cut], ["茶园位置", "茶园历史"])
    assert 0 < half < 1  # jieba words: 茶园/位置 exact; 建园/历史 vs 茶园/历史 share one word


def test_aggregate_macro_micro_and_signature() -> None:
    s = SegmentationSettings(tolerance=2, window=4)
    docs = [score_document(_memory(CUTS, ["a", "b", "c"]), CUTS, ["a", "b", "c"], s),
            score_document(_memory([]), CUTS, None, s)]
    result = aggregate(docs, s, missing=["gone"])
    assert result.micro == {"matched": 2, "predicted": 2, "gold": 4, "precision": 1.0, "recall": 0.5,
                            "f1": pytest.approx(2 / 3)}
    assert result.f1 == pytest.approx(0.5) and result.chunks_per_doc == 2.0
    assert result.mean_chunk_chars == pytest.approx(2 * len(TEXT) / 4)
    assert result.outline_rouge_l == 1.0 and result.outline_docs == 1 and result.missing == ["gone"]
    assert docs[1].window == 4 and "tol:2" in result.signature["boundary"] and "k:4" in result.signature["pk"]
    assert set(result.signature) == {"boundary", "pk", "window_diff", "outline"}
    assert json.loads(json.dumps(result.to_dict()))["settings"] == {"tolerance": 2, "window": 4}


# --- the gold loader -------------------------------------------------------------------------------------------


def test_the_gold_fixture_loads() -> None:
    gold = load_gold_segments(GOLD)
    assert [g.id for g in gold] == ["harbor-town", "solar-lamp", "tea-garden"]
    assert all(len(g.titles) == len(g.boundaries) + 1 for g in gold) and gold[2].lang == "zh"
    assert gold[0].segments[0] == (0, gold[0].boundaries[0]) and gold[0].segments[-1][1] == len(gold[0].text)
    assert len(load_gold_segments(GOLD, limit=2)) == 2


GOOD = {"id": "x", "text": "abcdefghij", "boundaries": [3, 6], "titles": ["A", "B", "C"]}


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"boundaries": [0, 6]}, "boundaries", "out of range"),
    ({"boundaries": [3, 10]}, "boundaries", "out of range"),
    ({"boundaries": [6, 3]}, "boundaries", "not sorted"),
    ({"boundaries": [3, 3]}, "boundaries", "occurs twice"),
    ({"boundaries": [3.0, 6]}, "boundaries", "not an integer"),
    ({"boundaries": ["3"]}, "boundaries", "not an integer"),
    ({"boundaries": [True]}, "boundaries", "not an integer"),
    ({"titles": ["A", "B"]}, "titles", "2 titles for 3 segments"),
    ({"titles": ["A", "B", 3]}, "titles", "expected strings"),
    ({"sections": [{"title": "A", "text": "abc"}, {"title": "B", "text": "def"}, {"title": "C", "text": "ghi"}]},
     "sections", "concatenate to text exactly"),
    ({"sections": [{"title": "A", "text": "ab"}, {"title": "B", "text": "cdef"}, {"title": "C", "text": "ghij"}]},
     "sections", "must agree"),
    ({"sections": [{"title": "A", "text": "abc"}, {"title": "X", "text": "def"}, {"title": "C", "text": "ghij"}]},
     "sections", "titles differ"),
    ({"lang": "fr"}, "lang", "not one of en, zh"),
    ({"text": ""}, "text", "empty"),
])
def test_bad_gold_records_are_named(tmp_path: Path, change: dict, field: str, words: str) -> None:
    path = tmp_path / "gold.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "id": "y", **change}) + "\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=words) as info:
        load_gold_segments(path)
    assert (info.value.path, info.value.line, info.value.field) == (str(path), 2, field)


def test_duplicate_ids_and_sections_without_titles(tmp_path: Path) -> None:
    path = tmp_path / "gold.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + json.dumps(GOOD) + "\n", encoding="utf-8")
    with pytest.raises(DatasetError, match="duplicate id 'x' \\(first on line 1\\)") as info:
        load_gold_segments(path)
    assert info.value.line == 3
    sections = [{"title": "A", "text": "abc"}, {"title": "B", "text": "def"}, {"title": "C", "text": "ghij"}]
    path.write_text(json.dumps({"id": 1, "text": "abcdefghij", "boundaries": [3, 6], "sections": sections}) + "\n",
                    encoding="utf-8")
    (doc,) = load_gold_segments(path)
    assert doc.id == "1" and doc.titles == ("A", "B", "C")  # section titles stand in for titles
    path.write_text(json.dumps({"id": "z", "text": "abc", "boundaries": []}) + "\n", encoding="utf-8")
    assert load_gold_segments(path)[0].titles is None


# --- scoring memories files ------------------------------------------------------------------------------------


def _gold_memories(gold: list[GoldDocument]) -> list[DocumentMemory]:
    return [DocumentMemory(g.id, g.text, [Scenario(t, "", s, e) for t, (s, e) in zip(g.titles, g.segments, strict=True)])
            for g in gold]


def test_score_memories_matches_by_id_and_refuses_other_texts_and_missing_documents(tmp_path: Path) -> None:
    gold = load_gold_segments(GOLD)
    mems = _gold_memories(gold)
    write_memories(tmp_path / "m.jsonl", mems)
    perfect = score_memories(gold, tmp_path / "m.jsonl")
    assert (perfect.f1, perfect.pk, perfect.window_diff, perfect.outline_rouge_l) == (1.0, 0.0, 0.0, 1.0)
    with pytest.raises(GoldMismatchError, match="1 of 3 gold documents have no memory \\(tea-garden\\)"):
        score_memories(gold, mems[:2])
    partial = score_memories(gold, mems[:2], allow_missing=True)
    assert partial.n_docs == 2 and partial.missing == ["tea-garden"]
    g = gold[0]
    trimmed = DocumentMemory(g.id, g.text.strip() + " ", [Scenario("", "", 0, len(g.text.strip()) + 1)])
    with pytest.raises(GoldMismatchError, match="another text than the gold document"):
        score_memories(gold, [trimmed, *mems[1:]])


# --- memreader eval and the bench script ---------------------------------------------------------------------


def test_memreader_eval_scores_rule_chunkers_and_given_memories(tmp_path: Path, monkeypatch, capsys) -> None:
    from memreader.cli import main

    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    write_memories(tmp_path / "m.jsonl", _gold_memories(load_gold_segments(GOLD)))
    code = main(["eval", "--config", str(REPO / "configs/eval/segmentation_demo.yaml"), "--set",
                 "methods=[fixed, sentence, memreader]", "--set", f"memories={tmp_path / 'm.jsonl'}",
                 "--set", "run=seg"])
    assert code == 0
    out = tmp_path / "home" / "runs" / "seg" / "segmentation"
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["task"] == "segmentation" and summary["gold"]["n_docs"] == 3
    methods = summary["methods"]
    assert list(methods) == ["fixed", "sentence", "memreader"]
    assert methods["memreader"]["f1"] == 1.0 and methods["memreader"]["outline_rouge_l"] == 1.0
    assert methods["fixed"]["outline_rouge_l"] is None and methods["fixed"]["calibration"]["within"]
    assert methods["sentence"]["f1"] > methods["fixed"]["f1"]  # sentence ends are where the gold sections end
    scores = json.loads((out / "methods" / "sentence" / "scores.json").read_text(encoding="utf-8"))
    assert len(scores["documents"]) == 3 and (out / "methods" / "fixed" / "memories.jsonl").is_file()
    assert "ratio to fixed" in (out / "report.txt").read_text(encoding="utf-8")
    assert "Pk|k:half-mean-gold-segment" in capsys.readouterr().out


def test_bench_script_prints_ratios_and_writes_json(tmp_path: Path, capsys, monkeypatch) -> None:
    import importlib.util

    monkeypatch.syspath_prepend(str(REPO / "scripts"))  # its `from _common import ...`, as `python scripts/x.py` has
    spec = importlib.util.spec_from_file_location("bench_segmentation", REPO / "scripts" / "bench_segmentation.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    gold = load_gold_segments(GOLD)
    write_memories(tmp_path / "gold.jsonl", _gold_memories(gold))
    write_memories(tmp_path / "one.jsonl", [DocumentMemory(g.id, g.text, [Scenario("", "", 0, len(g.text))])
                                            for g in gold])
    assert bench.main(["--gold", str(GOLD), "--method", f"one={tmp_path / 'one.jsonl'}", "--method",
                       f"gold={tmp_path / 'gold.jsonl'}", "--out", str(tmp_path / "b.json")]) == 0
    assert "ratio to one" in capsys.readouterr().out
    data = json.loads((tmp_path / "b.json").read_text(encoding="utf-8"))
    assert data["baseline"] == "one" and data["methods"]["gold"]["f1"] == 1.0
    assert data["methods"]["one"]["f1"] == 0.0 and data["ratios"]["gold"]["pk"] == 0.0
    assert data["ratios"]["gold"]["chunks_per_doc"] == pytest.approx(11 / 3)
