"""scripts/bench_selection_gold.py: perturbed candidates are valid tilings that differ from gold, skips are counted,
and the pick-rate, random-baseline and win-rate arithmetic is right (a fake scorer; no model)."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from memreader.core.guidance import approx_tokens
from memreader.core.schema import tiling_problems

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_selection_gold", REPO / "scripts" / "bench_selection_gold.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

EN = [("Alpha", "Alpha is a letter. It comes first. Greeks wrote it often. "),
      ("Beta", "Beta is the second letter. It follows alpha. "),
      ("Gamma", "Gamma is third. Physicists use it for rays. It also names a function.")]
ZH = [("长江", "长江是中国最长的河流。它流经十一个省份。"),
      ("黄河", "黄河是中国第二长河。它被称为母亲河。沿岸有很多古城。")]


def _record(doc_id: str, lang: str, sections: list[tuple[str, str]]) -> dict:
    text = "".join(t for _, t in sections)
    return {"id": doc_id, "lang": lang, "text": text, "sections": [{"title": a, "text": b} for a, b in sections]}


@pytest.fixture()
def gold_file(tmp_path: Path) -> Path:
    path = tmp_path / "gold.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n"
                            for r in (_record("en-1", "en", EN), _record("zh-1", "zh", ZH))), encoding="utf-8")
    return path


@pytest.mark.parametrize("record", [_record("en-1", "en", EN), _record("zh-1", "zh", ZH)])
def test_perturbations_are_valid_tilings_that_differ_from_gold(record: dict) -> None:
    cands, skipped = bench.candidates(record, 0, approx_tokens, 76)
    assert skipped == [] and sorted(k for k, _ in cands) == ["gold", "merge", "move", "split"]
    mems = dict(cands)
    text, n = record["text"], len(record["text"])
    ends = set(bench.sentence_ends(text))
    spans = {k: [(s.start, s.end) for s in m.scenarios] for k, m in mems.items()}
    for kind, sp in spans.items():
        assert tiling_problems(sp, n) == [] and mems[kind].document == text
        assert all(s in ends for s, _ in sp[1:])  # every cut at a sentence end
    starts = {k: {s for s, _ in sp} for k, sp in spans.items()}
    assert len(spans["gold"]) == len(record["sections"])
    assert [s.outline for s in mems["gold"].scenarios] == [t["title"] for t in record["sections"]]
    assert len(starts["move"]) == len(starts["gold"]) and len(starts["move"] ^ starts["gold"]) == 2
    moved_from, = starts["gold"] - starts["move"]
    moved_to, = starts["move"] - starts["gold"]
    assert not any(min(moved_from, moved_to) < e < max(moved_from, moved_to) for e in ends)  # one sentence
    assert starts["merge"] < starts["gold"] and len(starts["gold"] - starts["merge"]) == 1
    assert starts["split"] > starts["gold"] and len(starts["split"] - starts["gold"]) == 1
    cut, = starts["split"] - starts["gold"]
    halves = [s for s in mems["split"].scenarios if s.end == cut or s.start == cut]
    assert halves[0].outline == halves[1].outline and halves[1].core == bench.lead_sentences(
        text[cut:halves[1].end], 76, approx_tokens)
    # the same rule for every candidate: a scenario's core is its chunk's lead, its outline a gold title
    titles = {t["title"] for t in record["sections"]}
    for m in mems.values():
        assert all(s.core and text[s.start:s.end].startswith(s.core[:2]) and s.outline in titles for s in m.scenarios)


def test_impossible_perturbations_are_skipped() -> None:
    one = _record("one", "en", [("Only", "One sentence only.")])
    cands, skipped = bench.candidates(one, 0, approx_tokens, 76)
    assert [k for k, _ in cands] == ["gold"] and skipped == ["move", "merge", "split"]
    two = _record("two", "en", [("A", "First part. "), ("B", "Second part.")])
    cands, skipped = bench.candidates(two, 0, approx_tokens, 76)
    assert sorted(k for k, _ in cands) == ["gold", "merge"] and skipped == ["move", "split"]
    assert bench.perturb_move([0, 5], [5], 10, random.Random(0)) is None


def test_judge_and_summary_arithmetic() -> None:
    kinds = ["move", "gold", "merge", "split"]
    # gold: clarity last, completeness first -> RRF 1/64 + 1/61 loses to move's 1/61 + 1/62
    scores = [{"clarity": 0.9, "completeness": 0.5}, {"clarity": 0.1, "completeness": 0.9},
              {"clarity": 0.8, "completeness": 0.4}, {"clarity": 0.7, "completeness": 0.9}]
    row = bench.judge(kinds, scores, 60)
    assert row["pick"] == {"clarity": False, "completeness": True, "rrf": False} and row["random"] == 0.25
    assert row["wins"]["move"] == {"clarity": 0.0, "completeness": 1.0}
    assert row["wins"]["split"]["completeness"] == 0.5  # a tie counts one half
    best = bench.judge(["gold", "merge"], [{"clarity": 1, "completeness": 1}, {"clarity": 0, "completeness": 0}], 60)
    s = bench.summarize([row, best], 200, 0)
    assert s["pick"]["clarity"]["mean"] == 0.5 and s["pick"]["completeness"]["mean"] == 1.0
    assert s["pick"]["rrf"]["mean"] == 0.5 and s["pick"]["random"]["mean"] == pytest.approx((0.25 + 0.5) / 2)
    assert s["rrf_minus_random"]["mean"] == pytest.approx(((0 - 0.25) + (1 - 0.5)) / 2)
    assert s["minus_random"]["completeness"]["mean"] == pytest.approx(((1 - 0.25) + (1 - 0.5)) / 2)
    assert s["minus_random"]["clarity"]["mean"] == pytest.approx(((0 - 0.25) + (1 - 0.5)) / 2)
    merge = s["pairwise"]["merge"]
    assert merge["clarity"]["mean"] == 0.5 and merge["completeness"]["mean"] == 1.0 and merge["clarity"]["n"] == 2
    assert s["pairwise"]["move"]["clarity"]["n"] == 1
    b = bench.bootstrap([0.0, 1.0, 1.0, 0.0], 500, 1)
    assert b["lo"] <= b["mean"] == 0.5 <= b["hi"] and 0 <= b["lo"] < b["hi"] <= 1
    assert bench.bootstrap([1.0] * 5, 50, 0) == {"mean": 1.0, "lo": 1.0, "hi": 1.0, "n": 5}


class GoldFirst:
    """Fake evaluator: gold best on both metrics in English, best only on completeness in Chinese."""

    def score(self, memories):
        out = []
        for m in memories:
            doc, kind = m.doc_id.split("#")
            rank = ["gold", "move", "merge", "split"].index(kind)
            clarity = (1.0 - rank / 10) if doc.startswith("en") or kind != "gold" else 0.0
            out.append(SimpleNamespace(clarity=clarity, completeness=1.0 - rank / 10))
        return out


def test_main_with_a_fake_scorer(gold_file: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "sel.json"
    assert bench.main(["--gold", str(gold_file), "--out", str(out), "--resamples", "100"], scorer=GoldFirst()) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["documents"] == 2 and data["candidates"] == 8 and data["skipped"] == {"move": 0, "merge": 0, "split": 0}
    assert data["pick"]["clarity"]["mean"] == 0.5 and data["pick"]["completeness"]["mean"] == 1.0
    # zh: gold's 1/64 + 1/61 loses to move's 1/61 + 1/62, so RRF picks gold in one document of two
    assert data["pick"]["rrf"]["mean"] == 0.5 and data["pick"]["random"]["mean"] == 0.25
    assert data["rrf_minus_random"]["mean"] == 0.25 and data["rrf_minus_random"]["lo"] == -0.25
    assert data["rrf_beats_random"] is False and data["pairwise"]["split"]["completeness"]["mean"] == 1.0
    assert "RRF beats random outside the 95% interval: no" in printed and "rrf_k:60|" in printed
    assert bench.main(["--gold", str(gold_file), "--lang", "zh", "--limit", "1", "--out", str(out)],
                      scorer=GoldFirst()) == 0
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["documents"] == 1 and data["rows"][0]["id"] == "zh-1" and data["pick"]["clarity"]["mean"] == 0.0


def test_from_json_pools_earlier_runs_without_scoring(gold_file: Path, tmp_path: Path, capsys) -> None:
    en, zh, both = tmp_path / "en.json", tmp_path / "zh.json", tmp_path / "both.json"
    for lang, out in (("en", en), ("zh", zh)):
        assert bench.main(["--gold", str(gold_file), "--lang", lang, "--out", str(out)], scorer=GoldFirst()) == 0
    capsys.readouterr()
    assert bench.main(["--from-json", str(en), str(zh), "--out", str(both), "--resamples", "100"]) == 0
    data = json.loads(both.read_text(encoding="utf-8"))
    assert data["documents"] == 2 and data["pick"]["clarity"]["mean"] == 0.5 and data["pick"]["rrf"]["mean"] == 0.5
    assert data["minus_random"]["clarity"]["mean"] == 0.25 and "|pooled:2|" in capsys.readouterr().out
    other = json.loads(zh.read_text(encoding="utf-8"))
    other["settings"]["rrf_k"] = 10.0
    zh.write_text(json.dumps(other), encoding="utf-8")
    with pytest.raises(SystemExit, match="pool like runs only"):
        bench.main(["--from-json", str(en), str(zh)])
