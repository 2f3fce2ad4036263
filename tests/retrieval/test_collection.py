"""The store base (:class:`memreader.retrieval.milvus.MilvusCollection`) checked once for all three stores —
the memory index, the passage store and the conversation store: metadata round trip, schema-version
and foreign-collection refusals, the same error for the same bad request, close and reopen."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from memreader.retrieval import conversation_store, index, passages
from memreader.retrieval.conversation_store import ConversationStore, ConversationStoreError
from memreader.retrieval.index import MemoryIndex, MemoryIndexError
from memreader.retrieval.milvus import MilvusCollection, StoreError, connect, disconnect, resolve_uri
from memreader.retrieval.passages import PassageStore, PassageStoreError
from tests.retrieval.retrieval_samples import VOLCANO

pytestmark = pytest.mark.integration

NAME = "minilm-l6"
KINDS = ("index", "passages", "conversation")
CLASSES: dict[str, tuple[type[MilvusCollection], type[StoreError], str]] = {
    "index": (MemoryIndex, MemoryIndexError, index.DEFAULT_COLLECTION),
    "passages": (PassageStore, PassageStoreError, passages.DEFAULT_PASSAGE_COLLECTION),
    "conversation": (ConversationStore, ConversationStoreError, conversation_store.DEFAULT_COLLECTION),
}


def _open(kind: str, db: Path, embedder: Any) -> Any:
    """Open a store of ``kind`` for searching (a conversation store is created if missing)."""
    if kind == "index":
        return MemoryIndex.open(db, embedder=embedder, embedder_name=NAME)
    if kind == "passages":
        return PassageStore.open(db, embedder=embedder, embedder_name=NAME)
    return ConversationStore(db, {NAME: embedder}, bm25_language="en")


def _size(kind: str, store: Any) -> int:
    return store.counts()["chunk"] if kind == "index" else store.count() if kind == "passages" else store.count("talk")


def _bad_requests(kind: str, store: Any) -> list[Callable[[], Any]]:
    """An empty query, a blank query, and a result limit of 0, asked the way each store is asked."""
    if kind == "index":
        return [lambda: store.search(""), lambda: store.search_bm25("  ", "chunk", 3),
                lambda: store.search_lists("lava", ["chunk"], 0)]
    if kind == "passages":
        return [lambda: store.embed_query(""), lambda: store.bm25("  ", 3), lambda: store.knn([0.0] * 384, 0)]
    return [lambda: store.score_candidates("talk", "", ["bm25"], 3),
            lambda: store.score_candidates("talk", "  ", [NAME], 3),
            lambda: store.score_candidates("talk", "lava", ["bm25"], 0)]


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory, embedder: Any) -> dict[str, Path]:
    """One small store of each kind, built and closed: kind → its Milvus Lite file."""
    folder = tmp_path_factory.mktemp("stores")
    dbs = {kind: folder / f"{kind}.db" for kind in KINDS}
    with MemoryIndex(dbs["index"]) as built:
        built.build([VOLCANO], embedder, embedder_name=NAME, progress=False)
    with PassageStore.create(dbs["passages"]) as store:
        store.build([("lava", "Volcano", "Lava is molten rock."), ("ash", "Volcano", "Ash clouds ground planes.")],
                    embedder, embedder_name=NAME, progress=False)
    with ConversationStore(dbs["conversation"], {NAME: embedder}, bm25_language="en") as talk:
        talk.add_turns("talk", [("user", "Lava is molten rock."), ("assistant", "Noted.")])
    return dbs


def _record(db: Path, collection: str, key: str, change: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON record in ``key`` as another client reads it; ``change`` first rewrites it."""
    uri = resolve_uri(db)
    client = connect(uri)
    try:
        if change is not None:
            client.alter_collection_properties(collection, properties={key: json.dumps(change)})
        return json.loads(client.describe_collection(collection)["properties"][key])
    finally:
        disconnect(client, uri)


@pytest.mark.parametrize("kind", KINDS)
def test_metadata_round_trips_and_the_store_closes_and_reopens(kind: str, stores: dict[str, Path],
                                                              embedder: Any) -> None:
    cls, error, collection = CLASSES[kind]
    assert issubclass(cls, MilvusCollection) and cls.error is error
    assert issubclass(error, StoreError) and issubclass(error, ValueError) and issubclass(error, RuntimeError)
    with _open(kind, stores[kind], embedder) as store:
        meta, size = store.meta, _size(kind, store)
        assert meta[cls.VERSION_FIELD] == cls.VERSION and meta["bm25_language"] == "en"
        assert NAME in json.dumps(meta) and size == (3 if kind == "index" else 2)
        assert _record(stores[kind], collection, cls.META_KEY) == meta  # what another client reads
        store.close()  # closing twice is harmless
    with _open(kind, stores[kind], embedder) as again:
        assert again.meta == meta and _size(kind, again) == size


@pytest.mark.parametrize("kind", KINDS)
def test_another_schema_version_is_refused_naming_the_fix(kind: str, stores: dict[str, Path], embedder: Any) -> None:
    cls, error, collection = CLASSES[kind]
    meta = _record(stores[kind], collection, cls.META_KEY)
    _record(stores[kind], collection, cls.META_KEY, {**meta, cls.VERSION_FIELD: 0})
    try:
        with pytest.raises(error) as err:
            _open(kind, stores[kind], embedder)
        assert str(err.value).endswith(
            f"has schema version 0; this memreader reads version {cls.VERSION} — fix: {cls.REBUILD_FIX}")
    finally:
        _record(stores[kind], collection, cls.META_KEY, meta)
    with _open(kind, stores[kind], embedder) as store:  # the refused open freed the file
        assert store.meta == meta


@pytest.mark.parametrize("kind", KINDS)
def test_a_foreign_collection_or_a_bad_path_is_refused(kind: str, tmp_path: Path, embedder: Any) -> None:
    cls, error, collection = CLASSES[kind]
    db = tmp_path / "foreign.db"
    uri = resolve_uri(db)
    client = connect(uri)
    client.create_collection(collection, dimension=2)
    disconnect(client, uri)
    with pytest.raises(error, match=rf"not made by memreader \(no {cls.META_KEY} property\) — fix: pick another"):
        _open(kind, db, embedder)
    with pytest.raises(error, match=r"must end in \.db .* — fix: use a path like"):
        _open(kind, tmp_path / "store.sqlite", embedder)
    if kind != "conversation":  # a conversation store is created on first open
        with pytest.raises(error, match=rf"{cls.KIND} .*missing\.db does not exist — fix: {re.escape(cls.MISSING_FIX)}"):
            _open(kind, tmp_path / "missing.db", embedder)


@pytest.mark.parametrize("kind", KINDS)
def test_the_same_bad_request_gets_the_same_error(kind: str, stores: dict[str, Path], embedder: Any) -> None:
    with _open(kind, stores[kind], embedder) as store:
        messages = []
        for ask in _bad_requests(kind, store):
            with pytest.raises(StoreError) as err:
                ask()
            assert type(err.value) is store.error
            messages.append(str(err.value))
    assert messages[:2] == ["the query is empty — fix: ask a question"] * 2
    assert re.fullmatch(r"(limit|k|candidates)=0 is out of range — fix: use 1\.\.16384", messages[2])
