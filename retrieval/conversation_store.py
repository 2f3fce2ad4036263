"""Conversation memory: every turn kept verbatim in one Milvus collection, searchable by BM25 and embeddings.

A :class:`~memreader.retrieval.milvus.MilvusCollection` with one row per turn; turns are only appended (one writer
per conversation), and a store of another schema version, embedders or analyzer is refused with both named.
Fields, record and refusals: docs/MOMENTARY.md (The store).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pymilvus import DataType

from memreader.core.embedders import EMBED_BATCH, embedding_dim, encode
from memreader.retrieval.lexical import LANGUAGES, bm25_search
from memreader.retrieval.milvus import MAX_TEXT_BYTES, MilvusCollection, StoreError, string_literal

__all__ = ["BM25", "DEFAULT_COLLECTION", "SCHEMA_VERSION", "CandidateScores", "ConversationStore",
           "ConversationStoreError", "Turn", "vector_field"]

SCHEMA_VERSION = 1
DEFAULT_COLLECTION = "memreader_conversation"
BM25 = "bm25"
"""The lexical signal's name, beside the embedder names."""
BM25_SIGNAL = "the chat's BM25 signal (bm25_weight > 0)"
BM25_OFF = "set bm25_weight=0 (the turns are then scored by their embeddings alone)"
_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
_MAX_SPEAKER_BYTES = 64
_SCHEMA = [("pk", DataType.VARCHAR, {"is_primary": True, "max_length": 160}),
           ("conversation", DataType.VARCHAR, {"max_length": 128, "is_partition_key": True}),
           ("turn", DataType.INT64, {}), ("speaker", DataType.VARCHAR, {"max_length": _MAX_SPEAKER_BYTES}),
           ("timestamp", DataType.DOUBLE, {})]
_QUERY_CACHE = 32  # question vectors kept per embedder and question
_TURN_FIELDS = ["conversation", "turn", "speaker", "timestamp", "text"]


class ConversationStoreError(StoreError):
    """The store cannot be opened as asked, or a turn or search request is invalid."""


@dataclass(frozen=True)
class Turn:
    """One stored turn, verbatim."""

    conversation: str
    index: int
    """0-based position in the conversation (order told)."""
    speaker: str
    timestamp: float
    """Seconds since the epoch (UTC)."""
    text: str


@dataclass
class CandidateScores:
    """Raw scores of a candidate set: every signal has a score for every candidate turn."""

    turns: dict[int, Turn]
    """Candidate turns by index (the union of every signal's hits, plus the turns asked for)."""
    raw: dict[str, dict[int, float]]
    """Signal → turn index → raw score: BM25 (>= 0; 0 = no shared term) or cosine similarity."""
    hits: dict[str, list[int]]
    """Signal → the turn indices Milvus returned for it, best first (how the candidates were found)."""


def primary_key(conversation: str, index: int) -> str:
    """``"{conversation}#{index:09d}"``: one key per turn, the same on every rebuild."""
    return f"{conversation}#{index:09d}"


def vector_field(embedder: str) -> str:
    """The vector field of an embedder name: ``minilm-l6`` → ``vec_minilm_l6``."""
    slug = re.sub(r"[^0-9a-z]+", "_", embedder.lower()).strip("_")
    if not slug:
        raise ConversationStoreError(f"embedder name {embedder!r} has no letters or digits to name a field")
    return f"vec_{slug}"


def check_conversation_id(conversation: str) -> str:
    """``conversation`` when valid (1-128 of letters, digits, ``.``, ``_``, ``-``), else a clear error."""
    if not isinstance(conversation, str) or not _ID.fullmatch(conversation):
        raise ConversationStoreError(
            f"conversation id {conversation!r} is not valid",
            "use 1-128 letters, digits, '.', '_' or '-' (e.g. conversation=default)")
    return conversation


class ConversationStore(MilvusCollection):
    """Turns of one or more conversations in a Milvus collection, with BM25 and one vector field per embedder.

    ``embedders`` maps each embedder's name (as recorded in the store) to a loaded model. A new collection is
    created on first open; an existing one must match them and the BM25 language. Use as a context manager.
    """

    KIND = "conversation store"
    META_KEY = "memreader.conversation"
    VERSION = SCHEMA_VERSION
    VERSION_FIELD = "schema_version"
    MISSING_FIX = "open it with ConversationStore, which creates it"
    REBUILD_FIX = "start a new store (another db_path or collection); the old one is left as it is"
    BUILT = False  # created whole on first open: no build status
    error = ConversationStoreError

    def __init__(self, uri: str | Path, embedders: Mapping[str, Any], bm25_language: str = "zh",
                 collection: str = DEFAULT_COLLECTION, token: str = "") -> None:
        if bm25_language not in LANGUAGES:
            raise ConversationStoreError(
                f"bm25_language {bm25_language!r} is not one of {', '.join(LANGUAGES)}",
                "use zh (jieba: Chinese, and English split on spaces) or en (standard tokenizer); the "
                "analyzer is fixed when the store is created, before any text exists, so there is no auto")
        fields = [vector_field(name) for name in embedders]
        if len(set(fields)) != len(fields):
            raise ConversationStoreError(f"embedder names {list(embedders)} give clashing fields {fields}",
                                         "list each embedder once")
        super().__init__(uri, collection, token)
        self.embedders = dict(embedders)
        self._query_cache: dict[tuple[str, str], np.ndarray] = {}
        with self._closing_on_error():
            wanted = {"schema_version": SCHEMA_VERSION, "bm25_language": bm25_language, "embedders": [
                {"name": name, "field": vector_field(name), "dim": embedding_dim(model)}
                for name, model in self.embedders.items()]}
            if self._client.has_collection(collection):
                self._check_meta(wanted)
                self.load()
            else:
                self._create(_SCHEMA, {e["field"]: e["dim"] for e in wanted["embedders"]}, bm25_language,
                             {**wanted, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})

    @property
    def embedder_names(self) -> list[str]:
        """The embedders this store holds vectors of, in field order."""
        return [e["name"] for e in self.meta["embedders"]]

    @property
    def signals(self) -> list[str]:
        """Every signal a context can be scored by: ``bm25`` and each embedder name."""
        return [BM25, *self.embedder_names]

    def _check_meta(self, wanted: dict[str, Any]) -> None:
        """Refuse a store made with other embedders or another BM25 language than ``wanted``."""
        meta = self.meta  # checks that the store is ours and of this schema version
        have = [(e["name"], e["dim"]) for e in meta["embedders"]]
        want = [(e["name"], e["dim"]) for e in wanted["embedders"]]
        if sorted(have) != sorted(want):
            show = lambda pairs: "[" + ", ".join(f"{n} ({d}-dim)" for n, d in pairs) + "]"  # noqa: E731
            raise ConversationStoreError(
                f"{self._where()} was created with embedders {show(have)}, but {show(want)} were asked for",
                f"set embedders to {[n for n, _ in have]} (with one weight each), or use a new db_path or "
                "collection for the other embedders")
        if meta.get("bm25_language") != wanted["bm25_language"]:
            raise ConversationStoreError(
                f"{self._where()} analyzes text for BM25 as {meta.get('bm25_language')!r}, but "
                f"{wanted['bm25_language']!r} was asked for",
                f"set bm25_language={meta.get('bm25_language')}, or use a new db_path or collection")

    def count(self, conversation: str) -> int:
        """How many turns ``conversation`` holds."""
        return self._count(f"conversation == {string_literal(check_conversation_id(conversation))}")

    def add_turns(self, conversation: str, items: Sequence[tuple[str, str]],
                  timestamps: Sequence[float] | None = None, batch_size: int = EMBED_BATCH) -> list[Turn]:
        """Append ``(speaker, text)`` turns in order; all are checked before anything is written."""
        check_conversation_id(conversation)
        if timestamps is not None and len(timestamps) != len(items):
            raise ConversationStoreError(f"{len(items)} turns but {len(timestamps)} timestamps",
                                         "give one timestamp per turn, or none")
        for i, (speaker, text) in enumerate(items):
            if not isinstance(speaker, str) or not speaker.strip() or len(speaker.encode()) > _MAX_SPEAKER_BYTES:
                raise ConversationStoreError(f"turn {i}: speaker {speaker!r} is empty or over "
                                             f"{_MAX_SPEAKER_BYTES} bytes", "name the speaker, e.g. user")
            if not isinstance(text, str) or not text.strip():
                raise ConversationStoreError(f"turn {i} ({speaker}) has no text", "store only turns with text")
            if len(text.encode()) > MAX_TEXT_BYTES:
                raise ConversationStoreError(
                    f"turn {i} ({speaker}) is {len(text.encode())} bytes, over Milvus' {MAX_TEXT_BYTES}-byte limit",
                    "split it into several turns")
        if not items:
            return []
        start = self.count(conversation)
        taken = self._client.get(self.collection, ids=[primary_key(conversation, start)], output_fields=["turn"])
        if taken:  # the count and the indices disagree: another writer appended meanwhile
            raise ConversationStoreError(f"{self._where()}: turn {start} of {conversation!r} already exists",
                                         "let only one process write to a conversation at a time")
        now = time.time()
        turns = [Turn(conversation, start + i, speaker, float(timestamps[i]) if timestamps else now, text)
                 for i, (speaker, text) in enumerate(items)]
        rows = [{"pk": primary_key(conversation, t.index), "conversation": conversation, "turn": t.index, "speaker": t.speaker,
                 "timestamp": t.timestamp, "text": t.text} for t in turns]
        for e in self.meta["embedders"]:
            vectors = encode(self.embedders[e["name"]], [t.text for t in turns], batch_size=batch_size, kind="document")
            for row, vector in zip(rows, vectors, strict=True):
                row[e["field"]] = vector.astype(np.float32).tolist()
        self._insert(rows)
        return turns

    def recent(self, conversation: str) -> Turn | None:
        """The most recent turn of ``conversation`` (None when it has none)."""
        total = self.count(conversation)
        if total == 0:
            return None
        rows = self._client.get(self.collection, ids=[primary_key(conversation, total - 1)], output_fields=_TURN_FIELDS)
        assert rows, f"{conversation}: {total} turns counted but turn {total - 1} is missing"
        return _turn(rows[0])

    def embed_query(self, question: str, names: Sequence[str]) -> dict[str, np.ndarray]:
        """The question's unit vector from each embedder in ``names`` (``query`` side: E5 prefixes it); the last few
        questions' vectors are kept, so scoring one question several ways embeds it once."""
        out, dims = {}, {e["name"]: e["dim"] for e in self.meta["embedders"]}
        for name in names:
            key = (name, question)
            if key not in self._query_cache:
                if len(self._query_cache) >= _QUERY_CACHE:
                    self._query_cache.pop(next(iter(self._query_cache)))  # the oldest entry
                self._query_cache[key] = self._encode_query(self.embedders[name], question, dims[name], name)
            out[name] = self._query_cache[key]
        return out

    def score_candidates(self, conversation: str, question: str, signals: Sequence[str], limit: int,
                         include: Sequence[int] = ()) -> CandidateScores:
        """Find candidates by each signal (its ``limit`` best turns; ``include`` adds turns by index), then score
        every candidate by every signal, exactly: BM25 from a second BM25 search restricted to the candidates (no
        shared term scores 0), cosine from its stored vector, so no candidate misses a signal's score."""
        self._check_query(question)
        self._check_limit("candidates", limit)
        if BM25 in signals:
            self.require_bm25(BM25_SIGNAL, BM25_OFF)
        unknown = [s for s in signals if s not in self.signals]
        if unknown:
            raise ConversationStoreError(f"signals {unknown} are not in {self._where()}, which holds {self.signals}",
                                         "give weights only to bm25 and the store's embedders")
        conv = f"conversation == {string_literal(check_conversation_id(conversation))}"
        names = [s for s in signals if s != BM25]
        queries = self.embed_query(question, names)
        hits: dict[str, list[int]] = {}
        if BM25 in signals:
            found = bm25_search(self._client, self.collection, question, limit, filter=conv, output_fields=["turn"])
            hits[BM25] = [int(e["turn"]) for e, _ in found]
        for name in names:
            (res,) = self._client.search(self.collection, data=[queries[name].tolist()], anns_field=vector_field(name),
                                         limit=limit, filter=conv, output_fields=["turn"],
                                         search_params={"metric_type": "COSINE"})
            hits[name] = [int(r["entity"]["turn"]) for r in res]
        wanted = sorted({i for found in hits.values() for i in found} | set(include))
        if not wanted:
            return CandidateScores({}, {s: {} for s in signals}, hits)
        pks = [primary_key(conversation, i) for i in wanted]
        rows = self._client.get(self.collection, ids=pks, output_fields=_TURN_FIELDS + [vector_field(n) for n in names])
        turns = {int(r["turn"]): _turn(r) for r in rows}
        missing = [i for i in wanted if i not in turns]
        if missing:
            raise ConversationStoreError(f"{self._where()}: turns {missing[:5]} of {conversation!r} are missing",
                                         "the store is inconsistent; start a new one")
        raw: dict[str, dict[int, float]] = {}
        if BM25 in signals:
            scored = bm25_search(self._client, self.collection, question, len(pks),
                                 filter=f"pk in [{', '.join(string_literal(p) for p in pks)}]", output_fields=["turn"])
            bm25 = {int(e["turn"]): score for e, score in scored}
            raw[BM25] = {i: bm25.get(i, 0.0) for i in wanted}
        for name in names:
            raw[name] = {int(r["turn"]): _cosine(queries[name], r[vector_field(name)]) for r in rows}
        return CandidateScores(turns, {s: raw[s] for s in signals}, hits)


def _turn(row: Mapping[str, Any]) -> Turn:
    return Turn(str(row["conversation"]), int(row["turn"]), str(row["speaker"]), float(row["timestamp"]),
                str(row["text"]))


def _cosine(query: np.ndarray, stored: Sequence[float]) -> float:
    vector = np.asarray(stored, dtype=np.float32)
    norm = float(np.linalg.norm(vector)) * float(np.linalg.norm(query))
    return float(np.dot(query, vector) / norm) if norm > 0 else 0.0
