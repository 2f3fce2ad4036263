"""The cut scorer: features at every allowed chunk end (core/cut_features.py), the head, its breaks and its folder
(core/cut_head.py), its fit on gold boundaries (training/cut_fit.py), its training keys and the reader's use of it.

The model-free parts run on hand-made numbers; the rest on tiny random Llamas (2 layers, hidden size 32 and 48) on
SmolLM2's tokenizer (tests/training/conftest.py: the real SmolLM2 is never converted here). The features alone:
test_cut_features.py."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memreader.core.config import ConfigError
from memreader.core.cut_features import (
    FEATURES_VERSION,
    CutFeatures,
    CutScorerError,
    cut_dtype,
    labels_for,
)
from memreader.core.cut_head import (
    CutHead,
    CutScorer,
    Cutter,
    Scored,
    build_head,
    check_threshold,
    head_sha256,
    min_gap,
    pick_breaks,
    resolve_head_folder,
)
from memreader.core.memory_grammar import GrammarSettings, sentence_ends
from memreader.training.cut_fit import (
    CutFitSettings,
    GoldDoc,
    _Rows,
    boundary_f1,
    choose_threshold,
    fit_cut_head,
    load_gold,
    split_tune,
)

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("torch_one_thread")

# --- breaks, gaps, labels, thresholds (no model) ---------------------------------------------------------------


def test_pick_breaks_keeps_the_strongest_end_of_each_neighbourhood_above_the_threshold() -> None:
    ends = [100, 150, 260, 400, 700]
    p = np.array([0.6, 0.9, 0.7, 0.2, 0.5])
    # 150 (0.9) first; 100 is 50 away from it: dropped; 260 is 110 away: kept; 400 is below the threshold
    assert pick_breaks(ends, p, 0.5, gap=100) == [150, 260, 700]
    assert pick_breaks(ends, p, 0.5, gap=150) == [150, 700]  # 260 is now too close to the stronger 150
    assert pick_breaks(ends, p, 0.5, gap=1) == [100, 150, 260, 700]  # every end at or above the threshold
    assert pick_breaks(ends, p, 0.95, gap=1) == []
    assert pick_breaks(ends, p, 0.9, gap=1) == [150]  # p >= threshold counts
    # the order of the ends does not matter: the strongest wins even when it comes last
    assert pick_breaks([100, 150], np.array([0.6, 0.8]), 0.5, gap=100) == [150]
    assert Scored(ends, p).breaks(0.5, 100) == [150, 260, 700]
    assert pick_breaks([], np.zeros(0), 0.5, gap=10) == []


def test_scored_record_is_what_meta_cuts_keeps() -> None:
    record = Scored([10, 20], np.array([0.12345, 0.98765], dtype=np.float32)).record(0.456789, [20], "a/cut_head")
    assert record == {"head": "a/cut_head", "threshold": 0.4568, "breaks": [20], "ends": [10, 20], "p": [0.123, 0.988]}
    json.dumps(record)  # plain JSON: numpy floats would not serialise


def test_min_gap_is_the_grammars_shortest_chunk_for_the_texts_language() -> None:
    english = "The baker kneads the dough before dawn. " * 5
    chinese = "面包师在黎明前揉面。新鲜的面包在木架上冷却。" * 5
    assert min_gap(english) == 150
    assert min_gap(chinese) == 60  # 150 / cjk_char_weight 2.5
    assert min_gap(english, GrammarSettings(min_chunk_chars=300)) == 300
    assert min_gap(chinese, GrammarSettings(min_chunk_chars=300, cjk_char_weight=2.0)) == 150
    assert min_gap("", GrammarSettings(min_chunk_chars=1)) >= 1


def test_labels_for_marks_the_nearest_end_within_the_tolerance() -> None:
    ends = [10, 20, 30, 60]
    assert labels_for(ends, [20]).tolist() == [0, 1, 0, 0]
    assert labels_for(ends, [22], tolerance=3).tolist() == [0, 1, 0, 0]  # 2 characters past an end
    assert labels_for(ends, [27], tolerance=3).tolist() == [0, 0, 1, 0]  # nearer 30 than 20: only 30
    assert labels_for(ends, [45], tolerance=3).tolist() == [0, 0, 0, 0]  # 15 from the nearest end: no label
    assert labels_for(ends, [24], tolerance=3).tolist() == [0, 0, 0, 0]  # 4 > 3
    assert labels_for(ends, [5, 61, 100], tolerance=5).tolist() == [1, 0, 0, 1]  # before the first, past the last
    assert labels_for([], [5]).tolist() == []


@pytest.mark.parametrize("bad", [0, 1, -0.1, 1.5, True, False, "0.3", None, float("nan")])
def test_check_threshold_refuses_what_is_not_a_probability(bad: Any) -> None:
    with pytest.raises(CutScorerError, match=r"cut_threshold=.* is not a probability strictly between 0 and 1"):
        check_threshold(bad)


def test_check_threshold_takes_a_probability() -> None:
    assert check_threshold(0.3) == 0.3 and isinstance(check_threshold(0.3), float)
    with pytest.raises(CutScorerError, match="threshold=2"):
        check_threshold(2, what="threshold")


def test_boundary_f1_matches_one_to_one_within_the_tolerance() -> None:
    assert boundary_f1([[100, 200]], [[100, 200]], 3) == 1.0
    assert boundary_f1([[102]], [[100]], 3) == 1.0
    assert boundary_f1([[104]], [[100]], 3) == 0.0
    assert boundary_f1([[99, 101]], [[100]], 3) == pytest.approx(2 / 3)  # one gold, two predictions: one hit
    assert boundary_f1([[100], []], [[100], [50]], 3) == pytest.approx(2 / 3)  # micro over documents
    assert boundary_f1([[]], [[]], 3) == 1.0  # nothing to find and nothing found: perfect, as the eval scores it


def test_choose_threshold_picks_the_lowest_threshold_with_the_best_f1() -> None:
    text = "x" * 800  # English: breaks at least 150 apart
    rows = _Rows([GoldDoc("d", text, [400], "d")], [[200, 400, 600]], [np.zeros((3, 1))], [np.zeros(3)])
    # up to 0.3 all three ends are breaks (F1 0.5), up to 0.5 two (0.67), from 0.55 only 400 (1.0)
    threshold, f1 = choose_threshold([np.array([0.3, 0.9, 0.5])], rows, tolerance=3)
    assert (threshold, f1) == (0.55, 1.0)


def _gold(i: int, bounds: list[int] | None = None, group: str | None = None) -> GoldDoc:
    return GoldDoc(f"d{i}", "text", bounds if bounds is not None else [1], group or f"d{i}")


def test_split_tune_splits_by_group_and_refuses_too_few_documents() -> None:
    docs = [_gold(i, group=f"g{i % 10}") for i in range(100)]
    fit, tune = split_tune(docs, 0.3)
    assert fit and tune and len(fit) + len(tune) == 100
    assert not {d.group for d in fit} & {d.group for d in tune}  # a group never straddles the split
    assert split_tune(docs, 0.3) == (fit, tune)  # the same split every time
    with pytest.raises(CutScorerError, match="cannot be split .* give more documents"):
        split_tune([_gold(0)], 0.15)


# --- gold data -----------------------------------------------------------------------------------------------


def _write(path: Path, records: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


def test_load_gold_names_each_bad_input_with_its_fix(tmp_path: Path) -> None:
    with pytest.raises(CutScorerError, match="does not exist .*memreader structure-data"):
        load_gold(tmp_path / "missing.jsonl")
    ok = {"id": "a", "text": "One. Two.", "boundaries": [5]}
    bad = _write(tmp_path / "bad.jsonl", [ok, {"id": "b", "text": "Three. Four."}])
    with pytest.raises(CutScorerError, match=r"bad.jsonl line 2: not a document with gold boundaries"):
        load_gold(bad)
    _write(bad, [ok, "", "{not json"])
    with pytest.raises(CutScorerError, match="line 3: not a document"):  # blank lines are skipped, counted
        load_gold(bad)
    _write(bad, [ok, {"id": "b", "text": "Three. Four.", "boundaries": ["x"]}])
    with pytest.raises(CutScorerError, match="line 2: not a document"):
        load_gold(bad)
    _write(bad, [{"id": "c", "text": "Short.", "boundaries": [6]}])
    with pytest.raises(CutScorerError, match=r"line 1: a boundary lies outside \(0, 6\)"):
        load_gold(bad)
    none = _write(tmp_path / "none.jsonl", [{"id": "a", "text": "One. Two.", "boundaries": []}] * 3)
    with pytest.raises(CutScorerError, match="none of its 3 documents has a gold boundary, so there is no topic "
                                             "change to learn"):
        load_gold(none)
    with pytest.raises(CutScorerError, match="none of its 0 documents"):
        load_gold(_write(tmp_path / "empty.jsonl", [""]))


def test_load_gold_reads_ids_groups_and_limit(tmp_path: Path) -> None:
    path = _write(tmp_path / "g.jsonl", [{"id": "a", "text": "One. Two.", "boundaries": [5], "group": "G"},
                                         {"text": "Three. Four.", "boundaries": []},
                                         {"id": "c", "text": "Five. Six.", "boundaries": [6]}])
    docs = load_gold(path)
    assert [(d.id, d.group, d.boundaries) for d in docs] == [("a", "G", [5]), ("2", "2", []), ("c", "c", [6])]
    assert [d.id for d in load_gold(path, limit=2)] == ["a", "2"]


# --- the head and its folder (no base model) --------------------------------------------------------------------


def _head(dim: int = 6, hidden: int = 4, threshold: float = 0.4) -> CutHead:
    import torch

    torch.manual_seed(1)
    meta = {"format": 1, "dim": dim, "hidden": hidden, "threshold": threshold,
            "base_model": {"name": "m", "signature": {"hidden_size": 2}},
            "features": {"version": FEATURES_VERSION, "layers": 1, "window": 8, "max_tokens": 64}}
    return CutHead(build_head(dim, hidden), np.arange(dim, dtype=np.float32), np.full(dim, 2.0, np.float32), meta)


def test_head_round_trips_through_its_folder(tmp_path: Path) -> None:
    rows = np.random.default_rng(0).normal(size=(5, 6)).astype(np.float32)
    for hidden in (4, 0):  # one hidden layer, and a linear head
        head = _head(hidden=hidden)
        folder = head.save(tmp_path / f"h{hidden}")
        again = CutHead.load(folder)
        assert again.threshold == 0.4 and again.meta == head.meta
        np.testing.assert_array_equal(again.mean, head.mean)
        np.testing.assert_array_equal(again.probabilities(rows), head.probabilities(rows))
        assert ((0 < again.probabilities(rows)) & (again.probabilities(rows) < 1)).all()
    assert head.probabilities(np.zeros((0, 6), np.float32)).shape == (0,)


def test_head_of_another_version_or_no_head_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CutScorerError, match="is not a cut head folder"):
        CutHead.load(tmp_path)
    folder = _head().save(tmp_path / "h")
    meta = json.loads((folder / "head.json").read_text())
    (folder / "head.json").write_text(json.dumps({**meta, "features": {**meta["features"], "version": 99}}))
    with pytest.raises(CutScorerError, match="another version of the cut head .*fit it again"):
        CutHead.load(folder)


def test_the_committed_head_loads_and_matches_its_record() -> None:
    folder = REPO / "results/structure-adapter/cut_head"
    head = CutHead.load(folder)
    assert 0 < head.threshold < 1 and head.mean.shape == (head.meta["dim"],)
    signature = head.meta["base_model"]["signature"]
    assert head.meta["dim"] == 3 * signature["hidden_size"] + 2
    assert head.meta["features"]["layers"] <= signature["num_hidden_layers"]


def test_resolve_head_folder_auto_none_and_a_folder(tmp_path: Path) -> None:
    assert resolve_head_folder("none", "adapter") == (None, "cut head: off (cut_head=none): cuts are the model's alone")
    assert resolve_head_folder("", "adapter")[0] is None
    folder, note = resolve_head_folder("auto", "")
    assert folder is None and "no adapter" in note
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    folder, note = resolve_head_folder("auto", str(adapter))
    assert folder is None and f"adapter {adapter} has no cut_head/" in note and "cut_head: true" in note
    _head().save(adapter / "cut_head")
    assert resolve_head_folder("auto", str(adapter)) == (adapter / "cut_head", f"cut head: {adapter / 'cut_head'}")
    assert resolve_head_folder(str(adapter / "cut_head"), "")[0] == adapter / "cut_head"
    with pytest.raises(CutScorerError, match=f"cut_head={adapter}: no cut head there"):
        resolve_head_folder(str(adapter), "")  # the adapter, not its cut_head/


def test_head_sha256_changes_with_weights_and_record(tmp_path: Path) -> None:
    folder = _head().save(tmp_path / "h")
    first = head_sha256(folder)
    assert first == head_sha256(folder) and len(first) == 16
    _head(threshold=0.6).save(folder)
    second = head_sha256(folder)
    assert second != first
    head = _head(threshold=0.6)
    head.mean = head.mean + 1
    head.save(folder)
    assert head_sha256(folder) not in (first, second)


# --- training keys ----------------------------------------------------------------------------------------------


def test_training_config_cut_keys(tmp_path: Path) -> None:
    from memreader.training.config import make_train_config

    data = _write(tmp_path / "gold.jsonl", [{"id": "a", "text": "One. Two.", "boundaries": [5]}])
    cfg = make_train_config({"cut_only": True, "cut_data": str(data), "run": "cut-only", "cut_layers": 2,
                             "cut_hidden": 0})
    assert cfg.project.cut_only and cfg.project.cut_data == str(data) and cfg.project.train_file == ""
    assert (cfg.project.cut_layers, cfg.project.cut_hidden, cfg.project.cut_epochs) == (2, 0, 40)

    def problems(**values: Any) -> str:
        with pytest.raises(ConfigError) as err:
            make_train_config({"run": "cut-bad", **values})
        return str(err.value)

    assert "missing required key 'train_file'" in problems(cut_data=str(data))  # cut data alone is no cut_only
    assert "cut_head / cut_only need cut_data" in problems(train_file=str(data), cut_head=True)
    assert "cut_head / cut_only need cut_data" in problems(cut_only=True)
    said = problems(cut_only=True, cut_data=str(data), cut_layers=0, cut_epochs=-1, cut_hidden=-1)
    assert "cut_layers=0 is out of range: it must be >= 1" in said
    assert "cut_epochs=-1 is out of range: it must be >= 1" in said
    assert "cut_hidden=-1 is out of range: it must be >= 0" in said
    assert "cut_data='nowhere.jsonl': file not found" in problems(cut_only=True, cut_data="nowhere.jsonl")


# --- features and the fit, on tiny random Llamas ----------------------------------------------------------------


# A random model knows no topics, only tokens: a document's two parts draw their words from two small vocabularies.
WORDS = ("bread flour oven yeast dough butter".split(), "star comet orbit galaxy moon planet".split())


def _document(rng: random.Random) -> tuple[str, int]:
    """Sentences of one vocabulary, then of the other, joined by spaces (no line break at the join: the paragraph
    feature does not give it away); the offset where the second part starts."""
    first, second = WORDS if rng.random() < 0.5 else WORDS[::-1]

    def part(words: list[str]) -> str:
        return " ".join(" ".join(rng.choice(words) for _ in range(rng.randint(5, 7))).capitalize() + "."
                        for _ in range(rng.randint(3, 5)))

    head, tail = part(first), part(second)
    return f"{head} {tail}", len(head) + 1


@pytest.fixture(scope="module")
def gold_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(7)
    records = []
    for i in range(30):
        text, boundary = _document(rng)
        records.append({"id": f"doc{i}", "text": text, "boundaries": [boundary]})
    return _write(tmp_path_factory.mktemp("cut_gold") / "gold.jsonl", records)


FIT = dict(layers=1, window=8, hidden=16, epochs=20, lr=3e-3, batch=32, tune_share=0.3, seed=0)


@pytest.fixture(scope="module")
def fitted(tiny_llamas: dict[int, str], gold_file: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("cut_fit")
    settings = CutFitSettings(data=str(gold_file), model=tiny_llamas[32], cache_dir=str(root / "cache"), **FIT)
    meta = fit_cut_head(settings, root / "cut_head", threads=1)
    return {"meta": meta, "folder": root / "cut_head", "cache": root / "cache", "settings": settings}


@pytest.mark.integration
def test_fit_writes_a_head_with_its_threshold_curves_and_base_model(fitted: dict[str, Any],
                                                                    tiny_llamas: dict[int, str]) -> None:
    meta, folder = fitted["meta"], fitted["folder"]
    assert (folder / "head.safetensors").is_file() and json.loads((folder / "head.json").read_text()) == meta
    assert 0 < meta["threshold"] < 1
    assert meta["dim"] == 98 and meta["hidden"] == 16 and meta["format"] == 1
    assert meta["base_model"] == {"name": tiny_llamas[32], "signature": {
        "model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "vocab_size": 49152,
        "intermediate_size": 64, "num_attention_heads": 4}}
    feats = meta["features"]
    assert {k: feats[k] for k in ("version", "layers", "window", "max_tokens")} == {
        "version": FEATURES_VERSION, "layers": 1, "window": 8, "max_tokens": 1024}
    assert not feats.get("drop")  # the hidden-state rows alone unless asked for
    assert [c["epoch"] for c in meta["curves"]] == list(range(1, 21))
    fit = meta["fit"]
    assert fit["documents"]["fit"] + fit["documents"]["tune"] == 30 and fit["documents"]["tune"] > 0
    assert fit["ends"]["fit_boundaries"] == fit["documents"]["fit"]  # every gold boundary is an allowed end
    assert fit["best_epoch"] == min(meta["curves"], key=lambda c: c["tune_loss"])["epoch"]
    assert fit["tune_loss"] == min(c["tune_loss"] for c in meta["curves"])
    assert meta["curves"][-1]["loss"] < meta["curves"][0]["loss"]  # it learns
    assert fit["tune_f1"] >= 0.5  # two vocabularies: the join is easy to see
    assert len(list(fitted["cache"].glob("*.npz"))) == 30


@pytest.mark.integration
def test_a_fitted_head_scores_the_same_after_loading(fitted: dict[str, Any], features: CutFeatures) -> None:
    folder = fitted["folder"]
    text, _ = _document(random.Random(99))
    scorer = CutScorer.load(folder, fitted["settings"].model)
    assert scorer.threshold == fitted["meta"]["threshold"] and scorer.features.layers == 1
    assert scorer.features.window == 8
    scored = scorer.score(text)
    ends, rows = features.of(text)  # window 32: other rows
    assert scored.ends == ends
    again = CutHead.load(folder)
    _, rows8 = scorer.features.of(text)
    np.testing.assert_array_equal(scored.p, again.probabilities(rows8))
    assert scored.p.shape == (len(ends),) and ((0 <= scored.p) & (scored.p <= 1)).all()


@pytest.mark.integration
def test_a_head_is_refused_on_another_base_model(fitted: dict[str, Any], tiny_llamas: dict[int, str]) -> None:
    with pytest.raises(CutScorerError) as err:
        CutScorer.load(fitted["folder"], tiny_llamas[48])
    said = str(err.value)
    assert f"fitted on {tiny_llamas[32]}" in said and f"not on the reader's model {tiny_llamas[48]}" in said
    assert "'hidden_size': 32" in said and "'hidden_size': 48" in said
    assert f"read with model={tiny_llamas[32]}" in said


@pytest.mark.integration
def test_the_reader_keys_and_opens_the_head(fitted: dict[str, Any], tiny_llamas: dict[int, str], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from memreader.inference.reader import ReadConfig, open_cutter, read_key

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_model.safetensors").write_bytes(b"weights")
    model = tiny_llamas[32]
    plain = read_key(ReadConfig(input="c.jsonl", model=model, adapter=str(adapter)))  # auto: the adapter has no head
    assert read_key(ReadConfig(input="c.jsonl", model=model, adapter=str(adapter), cut_head="none")) == plain
    head = str(fitted["folder"])
    with_head = read_key(ReadConfig(input="c.jsonl", model=model, adapter=str(adapter), cut_head=head))
    assert with_head != plain
    assert read_key(ReadConfig(input="c.jsonl", model=model, adapter=str(adapter), cut_head=head,
                               cut_threshold=0.3)) not in (plain, with_head)
    # the same head beside the adapter, found by auto: the key of its hash, not of its path
    shutil.copytree(head, adapter / "cut_head")
    assert read_key(ReadConfig(input="c.jsonl", model=model, adapter=str(adapter))) == with_head

    class Grammars:
        settings = GrammarSettings(min_chunk_chars=40)

    cfg = ReadConfig(input="c.jsonl", model=model, adapter=str(adapter), cut_threshold=0.3)
    cutter = open_cutter(cfg, Grammars())
    assert isinstance(cutter, Cutter) and cutter.threshold == 0.3
    assert f"read: cut head: {adapter / 'cut_head'}" in capsys.readouterr().out
    text, _ = _document(random.Random(5))
    breaks, record = cutter(text)
    assert record["head"] == (adapter / "cut_head").as_posix() and record["threshold"] == 0.3
    assert record["breaks"] == breaks and record["ends"] == sentence_ends(text) and len(record["p"]) == len(
        record["ends"])
    p_at = dict(zip(record["ends"], record["p"], strict=True))
    assert breaks and all(p_at[b] >= 0.3 - 1e-3 for b in breaks)  # p is kept rounded to 3 places
    assert all(b - a >= 40 for a, b in zip(breaks, breaks[1:], strict=False))
    assert cutter.documents == 1 and cutter.seconds > 0
    assert cutter.describe() == {"head": (adapter / "cut_head").as_posix(), "threshold": 0.3, "documents": 1,
                                 "seconds": round(cutter.seconds, 2), "dtype": cut_dtype("auto")}
    # the prefill's dtype: auto is the CPU's faster (the project's probe); bf16 autocast gives the same breaks here;
    # it is part of the read key (its scores differ in the last digits); a wrong name is a config problem
    bf16 = open_cutter(replace(cfg, cut_dtype="bfloat16"), Grammars())
    assert bf16.describe()["dtype"] == "bfloat16" and bf16(text)[0] == breaks
    assert read_key(replace(cfg, cut_dtype="bfloat16")) != read_key(replace(cfg, cut_dtype="float32"))
    assert "cut_dtype: 'half' is not one of auto, float32, bfloat16" in replace(cfg, cut_dtype="half").problems()
    assert open_cutter(ReadConfig(input="c.jsonl", model=model, adapter=str(adapter), cut_head="none"),
                       Grammars()) is None
    # unguided: auto quietly goes without the head, a named head is refused
    assert open_cutter(ReadConfig(input="c.jsonl", model=model, adapter=str(adapter)), None) is None
    assert "not guided" in capsys.readouterr().out
    with pytest.raises(ValueError, match="needs guided reading"):
        open_cutter(ReadConfig(input="c.jsonl", model=model, cut_head=head), None)
    stored = open_cutter(ReadConfig(input="c.jsonl", model=model, cut_head=head), Grammars())
    assert stored.threshold == fitted["meta"]["threshold"]  # cut_threshold 0: the head's own
