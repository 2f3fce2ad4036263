"""score_pairs / ScoreReport / format_table, the ``memreader score`` entry point, and WordNet set-up errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nltk
import numpy as np
import pytest

import memreader.eval.metrics as metrics
import memreader.eval.wordnet as wordnet
from memreader.cli import main as memreader_main
from memreader.core.config import ConfigError
from memreader.eval.metrics import resolve_config
from memreader.eval.score import compare, format_table, score_pairs
from memreader.eval.wordnet import WordNetMissing, find_wordnet

REPO = Path(__file__).resolve().parents[2]
PREDS = ["厦门大学。", "上海和杭州两地", "", "报告比较了两座城市"]
REFS = ["厦门大学。", ["上海和杭州", "上海、杭州"], "北京", "报告比较了上海和杭州"]


def test_score_pairs_report() -> None:
    report = score_pairs(PREDS, REFS, n_resamples=200)
    assert set(report.metrics) == {"bleu_1", "bleu_avg", "rouge_l", "meteor"}
    for name, result in report.metrics.items():
        assert len(result.per_example) == 4 and result.per_example[2] == 0.0  # blank prediction scores 0
        assert result.value == pytest.approx(np.mean(result.per_example))
        assert result.interval.low <= result.value <= result.interval.high, name
    assert report.n == 4 and report.excluded == []
    assert report.metrics["rouge_l"].per_example[0] == 1.0
    assert report.signatures()["meteor"].startswith("METEOR|tok:jieba-") and "wordnet:3.0" in report.signatures()["meteor"]
    data = json.loads(json.dumps(report.to_dict()))
    assert data["metrics"]["bleu_avg"]["signature"].startswith("BLEU-Avg|") and data["config"]["tokenizer"] == "jieba"
    assert data["versions"]["nltk"] and data["metrics"]["meteor"]["interval"]["seed"] == 12345


def test_crud_profile_excludes_blank_predictions() -> None:
    mom, crud = score_pairs(PREDS, REFS, n_resamples=100), score_pairs(PREDS, REFS, "crud", n_resamples=100)
    assert crud.excluded == ["2"] and crud.n == 3
    assert crud.metrics["rouge_l"].value == pytest.approx(mom.metrics["rouge_l"].value * 4 / 3)
    assert crud.metrics["meteor"].per_example == mom.metrics["meteor"].per_example


def test_overrides_reach_the_signature() -> None:
    report = score_pairs(PREDS, REFS, meteor_wordnet=False, bleu_max_order=2, n_resamples=50, ids=list("abcd"))
    assert "wordnet:off" in report.signatures()["meteor"] and "order:2" in report.signatures()["bleu_avg"]
    assert report.ids == ["a", "b", "c", "d"]
    with pytest.raises(ConfigError, match="unknown metric setting.*meteor_alfa"):
        score_pairs(PREDS, REFS, meteor_alfa=0.8)
    with pytest.raises(ConfigError, match="unknown metric profile 'sacre'"):
        score_pairs(PREDS, REFS, profile="sacre")


def test_corpus_level_report_and_comparison() -> None:
    opts = {"bleu_level": "corpus", "multi_ref": "native", "meteor_wordnet": False, "n_resamples": 200}
    a = score_pairs(PREDS, REFS, **opts)
    b = score_pairs(["厦门", "上海", "", "两座城市"], REFS, **opts)
    assert a.metrics["bleu_avg"].aggregation == "corpus" and a.metrics["rouge_l"].aggregation == "mean"
    tests = compare(a, b, n_resamples=200)
    assert tests["bleu_1"].delta == pytest.approx(a.metrics["bleu_1"].value - b.metrics["bleu_1"].value)
    assert tests["rouge_l"].delta == pytest.approx(a.metrics["rouge_l"].value - b.metrics["rouge_l"].value)
    with pytest.raises(ValueError, match="signatures differ"):
        compare(a, score_pairs(PREDS, REFS, meteor_wordnet=False, n_resamples=50))


def test_comparison_leaves_out_items_either_report_excluded() -> None:
    a = score_pairs(PREDS, REFS, "crud", n_resamples=100)  # excludes "2", its blank prediction
    b = score_pairs(["厦门", "", "北京", "两座城市"], REFS, "crud", n_resamples=100)  # excludes "1"
    assert (a.excluded, b.excluded) == (["2"], ["1"])
    tests = compare(a, b, n_resamples=100)
    ra, rb = a.metrics["rouge_l"].per_example, b.metrics["rouge_l"].per_example
    assert tests["rouge_l"].n == 2 and tests["rouge_l"].delta == pytest.approx((ra[0] - rb[0] + ra[3] - rb[3]) / 2)


def test_format_table() -> None:
    a = score_pairs(PREDS, REFS, n_resamples=100)
    b = score_pairs(PREDS, REFS, "crud", n_resamples=100)
    table = format_table({"mom": a, "crud": b})
    lines = table.splitlines()
    assert lines[0].split() == ["system", "n", "BLEU-1", "BLEU-Avg", "ROUGE-L", "METEOR"]
    assert lines[2].startswith("mom") and lines[3].startswith("crud")
    assert "signatures (mom):" in table and "bp:divided-out" in table and "seed 12345" in table
    assert "excluded (blank, empty=skip): crud: 1" in table
    assert "signatures:" in format_table(a)


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    refs = [{"id": f"q{i}", "answers": r if isinstance(r, list) else [r]} for i, r in enumerate(REFS)]
    return {
        "ref": _jsonl(tmp_path / "refs.jsonl", refs),
        "pred": _jsonl(tmp_path / "preds.jsonl", [{"id": f"q{i}", "prediction": p} for i, p in enumerate(PREDS)][::-1]),
        "base": _jsonl(tmp_path / "base.jsonl", [{"id": f"q{i}", "prediction": "上海"} for i in range(4)]),
    }


def test_cli_prints_table_and_writes_json(files: dict[str, Path], tmp_path: Path, capsys) -> None:
    out = tmp_path / "scores.json"
    code = score_main(["--pred", str(files["pred"]), "--ref", str(files["ref"]), "--out", str(out),
                 "--baseline", str(files["base"]), "--bootstrap", "200", "--workers", "1"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "BLEU-Avg" in printed and "ROUGE-L  ROUGE-L|score:F|tok:jieba-" in printed
    assert "paired METEOR" in printed and "score: 4 examples" in printed
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["report"]["ids"] == ["q0", "q1", "q2", "q3"]  # reference-file order
    assert data["report"]["metrics"]["rouge_l"]["per_example"][0] == 1.0
    assert len(data["inputs"]["pred_sha256"]) == 64 and set(data["baseline"]["paired_tests"]) == {
        "bleu_1", "bleu_avg", "rouge_l", "meteor"}


def test_cli_default_output_under_memreader_home(files, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    code = score_main(["--pred", str(files["pred"]), "--ref", str(files["ref"]), "--run", "t1", "--profile", "crud",
                 "--set", "meteor_wordnet=false", "--no-per-example", "--bootstrap", "50"])
    assert code == 0 and "wordnet:off" in capsys.readouterr().out
    data = json.loads((tmp_path / "home" / "runs" / "t1" / "score" / "scores.json").read_text(encoding="utf-8"))
    assert data["report"]["profile"] == "crud" and "per_example" not in data["report"]["metrics"]["meteor"]


def test_cli_config_yaml_and_resolved_config(files, tmp_path, monkeypatch, capsys) -> None:
    """--config + --set like every stage: YAML metrics merge with --set metric keys, and the resolved config
    lands beside the report (config.yaml in the run folder, <stem>.config.yaml beside an explicit out)."""
    import yaml

    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    config = tmp_path / "score.yaml"
    config.write_text(yaml.safe_dump({"pred": str(files["pred"]), "ref": str(files["ref"]), "profile": "crud",
                                      "metrics": {"bleu_max_order": 2}, "bootstrap": 50, "run": "cfg"}),
                      encoding="utf-8")
    assert score_main(["--config", str(config), "--set", "meteor_wordnet=false", "--set", "seed=7"]) == 0
    assert "order:2" in capsys.readouterr().out
    folder = tmp_path / "home" / "runs" / "cfg" / "score"
    written = yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8"))
    assert written["metrics"] == {"bleu_max_order": 2, "meteor_wordnet": False}
    assert written["profile"] == "crud" and written["seed"] == 7 and written["bootstrap"] == 50
    data = json.loads((folder / "scores.json").read_text(encoding="utf-8"))
    assert data["report"]["metrics"]["meteor"]["interval"]["seed"] == 7
    out = tmp_path / "elsewhere" / "mine.json"
    assert score_main(["--config", str(config), "--set", f"out={out}", "--set", "meteor_wordnet=false"]) == 0
    assert out.is_file() and yaml.safe_load((out.parent / "mine.config.yaml").read_text())["out"] == str(out)


def test_cli_errors_name_the_problem(files: dict[str, Path], tmp_path: Path, capsys) -> None:
    short = _jsonl(tmp_path / "short.jsonl", [{"id": "q0", "prediction": "x"}, {"id": "zz", "prediction": "y"}])
    assert score_main(["--pred", str(short), "--ref", str(files["ref"])]) == 2
    err = capsys.readouterr().err
    assert "3 reference id(s) have no prediction" in err and "q1, q2, q3" in err and "not in" in err and "zz" in err
    assert score_main(["--pred", str(files["pred"]), "--ref", str(files["ref"]), "--set", "bleu_smoothing=exp"]) == 2
    assert "bleu_smoothing: 'exp' is not one of none, add1" in capsys.readouterr().err


@pytest.mark.heavy
def test_python_dash_m_entry_point(files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "m.json"
    proc = subprocess.run(
        [sys.executable, "-m", "memreader.eval.score", "--pred", str(files["pred"]), "--ref", str(files["ref"]),
         "--out", str(out), "--set", "meteor_wordnet=false", "--bootstrap", "50"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "signatures:" in proc.stdout and json.loads(out.read_text(encoding="utf-8"))["report"]["n"] == 4


def test_missing_wordnet_is_a_clear_error(tmp_path: Path, monkeypatch) -> None:
    """Neither a WordNet database folder nor nltk's downloader (faked: a remote service): the error names the
    command and the WordNet-free switch (tests/eval/test_wordnet.py installs it when a source is there)."""
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    monkeypatch.setattr(wordnet, "SOURCE", str(tmp_path / "nowhere"))
    monkeypatch.setattr(wordnet, "NLTK_DATA", tmp_path / "env")
    monkeypatch.setattr(nltk, "download", lambda *a, **kw: False)
    with pytest.raises(WordNetMissing, match=r"memreader setup-wordnet.*meteor_wordnet=false"):
        find_wordnet()
    with pytest.raises(WordNetMissing):
        metrics.prepare(resolve_config("mom", meteor_alpha=0.85))  # a config not loaded before
    metrics.prepare(resolve_config("mom", meteor_alpha=0.85, meteor_wordnet=False))  # explicit opt-out works


def score_main(argv: list[str]) -> int:
    return memreader_main(["score", *argv])
