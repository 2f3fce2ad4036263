"""A passage store: plain passages in one Milvus collection, searched densely and by BM25.

    with PassageStore.create("passages.db") as store:
        store.build([("p1", "Tea", "Green tea steeps at 80 °C."), ...], embedder, embedder_name="minilm-l6")
    with PassageStore.open("passages.db", embedder=embedder, embedder_name="minilm-l6") as store:
        hits = store.knn(store.embed_query("How hot for green tea?"), k=20)
        more = store.bm25("green tea temperature", k=5)

Flat passages (not layered memories) for pipelines that retrieve passages directly, like MeVe
(:mod:`memreader.retrieval.meve`). Fields, token counts and refusals: docs/MEVE.md (Sources).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pymilvus import DataType
from tqdm import tqdm

from memreader.core.embedders import EMBED_BATCH, embedding_dim, encode
from memreader.retrieval.lexical import bm25_search, resolve_language
from memreader.retrieval.milvus import MAX_TEXT_BYTES, MilvusCollection, StoreError
from memreader.retrieval.rows import MAX_DOC_ID_BYTES
from memreader.retrieval.token_counter import TokenCounter

__all__ = ["DEFAULT_PASSAGE_COLLECTION", "PassageHit", "PassageStore", "PassageStoreError"]

DEFAULT_PASSAGE_COLLECTION = "memreader_passages"
STORE_FORMAT = 2  # 2: the tokens field (a passage's count in the budget tokenizer named at build time)
_MAX_ID_BYTES = 512
_SCHEMA = [("pk", DataType.VARCHAR, {"is_primary": True, "max_length": _MAX_ID_BYTES}),
           ("doc_id", DataType.VARCHAR, {"max_length": MAX_DOC_ID_BYTES}),
           ("tokens", DataType.INT32, {})]
_FIELDS = ["pk", "doc_id", "text", "tokens"]


class PassageStoreError(StoreError):
    """The passage store is missing, unfinished, or does not match the embedder or the input."""


@dataclass(frozen=True)
class PassageHit:
    """One passage returned by a dense or a BM25 search (or an adapter over another index)."""

    id: str
    doc_id: str
    text: str
    rank: int
    """1-based rank in the list it came from."""
    score: float
    """Cosine similarity for a dense search, the BM25 score (positive, unbounded) for a BM25 search."""
    vector: np.ndarray | None = field(default=None, compare=False)
    """The stored unit vector (float32) when the search returned it (dense searches do), else ``None``."""
    where: dict[str, Any] | None = field(default=None, compare=False)
    """The passage's source file, pages and heading path, when its store knows them (the memory index does)."""
    tokens: int | None = None
    """The passage's tokens in the tokenizer whose key is the store's :attr:`PassageStore.token_key`, counted when
    the store was built (None: not counted)."""


class PassageStore(MilvusCollection):
    """Passages in one Milvus collection: build, open, dense kNN, BM25, stored vectors by id. Use as a context
    manager (or call :meth:`close`)."""

    KIND = "passage store"
    META_KEY = "memreader.passages"
    VERSION = STORE_FORMAT
    ALSO_READS = (1,)  # a store built before the tokens field: searched without it, MeVe counts its passages
    MISSING_FIX = "build it first with PassageStore.build (e.g. scripts/bench_meve.py)"
    REBUILD_FIX = "rebuild it with PassageStore.build"
    error = PassageStoreError

    def __init__(self, uri: str | Path, collection: str = DEFAULT_PASSAGE_COLLECTION, embedder: Any = None,
                 token: str = "", must_exist: bool = False) -> None:
        super().__init__(uri, collection, token, must_exist=must_exist)
        self.embedder = embedder

    @classmethod
    def create(cls, uri: str | Path, collection: str = DEFAULT_PASSAGE_COLLECTION, embedder: Any = None,
               token: str = "") -> PassageStore:
        """A store to :meth:`build` into (the file or collection need not exist yet)."""
        return cls(uri, collection, embedder, token=token)

    @classmethod
    def open(cls, uri: str | Path, collection: str = DEFAULT_PASSAGE_COLLECTION, embedder: Any = None,
             embedder_name: str | None = None, token: str = "") -> PassageStore:
        """Open a completely built store for searching; ``embedder_name``, when given, must be the embedder it was
        built with (vectors of two models live in different spaces: another model would rank nonsense)."""
        store = cls(uri, collection, embedder, token=token, must_exist=True)
        with store._closing_on_error():
            store._check_embedder(embedder_name, store.meta["embedder"])
            store.load()
        return store

    @property
    def token_key(self) -> str | None:
        """The key (:attr:`memreader.retrieval.token_counter.TokenCounter.key`) of the tokenizer that counted the stored
        passages at build time, or None when they were not counted."""
        return (self.meta.get("tokens") or {}).get("key")

    @property
    def _fields(self) -> list[str]:
        return _FIELDS if self.meta.get("format", 1) >= 2 else _FIELDS[:-1]

    def _hits(self, found: list[tuple[dict[str, Any], float]]) -> list[PassageHit]:
        """``(entity, score)`` pairs as hits ranked by score, ties by id (reproducible)."""
        ordered = sorted(found, key=lambda item: (-item[1], item[0]["pk"]))
        # the vector in one conversion in C (a per-float Python loop cost ~0.6 ms for 20 hits of 384 dimensions)
        return [PassageHit(id=e["pk"], doc_id=e["doc_id"], text=e["text"], rank=rank, score=score,
                           vector=np.asarray(e["vector"], dtype=np.float32) if "vector" in e else None,
                           tokens=int(e["tokens"]) if self.token_key and "tokens" in e else None)
                for rank, (e, score) in enumerate(ordered, start=1)]

    @staticmethod
    def _validate(passages: Iterable[Any]) -> list[tuple[str, str, str]]:
        """``(id, doc_id, text)`` triples from triples or objects with ``id``/``title``/``text`` (such as
        :class:`memreader.eval.datasets.Passage`); every problem of the input is collected before failing."""
        rows, problems, seen = [], [], set()
        for i, item in enumerate(passages):
            if isinstance(item, (tuple, list)) and len(item) == 3:
                pid, doc_id, text = item
            elif all(hasattr(item, a) for a in ("id", "title", "text")):
                pid, doc_id, text = item.id, item.title, item.text
            else:
                problems.append(f"passage {i}: expected (id, doc_id, text) or an object with id/title/text, "
                                f"got {type(item).__name__}")
                continue
            if not all(isinstance(v, str) for v in (pid, doc_id, text)):
                problems.append(f"passage {i}: id, doc_id and text must be strings")
                continue
            if not pid or len(pid.encode()) > _MAX_ID_BYTES:
                problems.append(f"passage {i}: id {pid[:40]!r} must be 1 to {_MAX_ID_BYTES} bytes")
            elif pid in seen:
                problems.append(f"passage {i}: id {pid!r} occurs twice; ids must be unique")
            seen.add(pid)
            if len(doc_id.encode()) > MAX_DOC_ID_BYTES:
                problems.append(f"passage {pid!r}: doc_id is over {MAX_DOC_ID_BYTES} bytes; shorten it")
            if not text.strip():
                problems.append(f"passage {pid!r}: text is blank; drop it from the input")
            elif len(text.encode()) > MAX_TEXT_BYTES:
                problems.append(f"passage {pid!r}: text is {len(text.encode())} bytes, over Milvus' "
                                f"{MAX_TEXT_BYTES}-byte limit; split it")
            rows.append((pid, doc_id, text))
        if problems:
            shown = problems[:10] + ([f"... and {len(problems) - 10} more"] if len(problems) > 10 else [])
            raise PassageStoreError("the passages cannot be stored:\n  - " + "\n  - ".join(shown))
        if not rows:
            raise PassageStoreError("no passages to store", "pass at least one (id, doc_id, text)")
        return rows

    def build(self, passages: Iterable[Any], embedder: Any = None, embedder_name: str = "unnamed",
              batch_size: int = EMBED_BATCH, bm25_language: str = "auto", progress: bool = True, tokenizer: str = "") -> int:
        """Drop and rebuild the collection from ``passages`` (:meth:`_validate`: checked whole before the collection
        is touched; a build that stops half-way leaves the store marked unfinished); returns how many were stored.
        ``tokenizer`` (MeVe's ``budget_tokenizer``): each passage's tokens in it are counted now and stored, so that
        MeVe's budget does not tokenise the candidates of every question (:attr:`token_key` says which counted).
        """
        embedder = embedder or self.embedder
        if embedder is None:
            raise PassageStoreError("build needs an embedder", "pass embedder= (e.g. memreader.core.runtime.load_embedder())")
        if batch_size < 1:
            raise PassageStoreError(f"batch_size must be >= 1, got {batch_size}")
        rows = self._validate(passages)
        language = resolve_language(bm25_language, (t for _, _, t in rows))
        dim = embedding_dim(embedder)
        self.embedder = embedder
        if self._client.has_collection(self.collection):
            self._drop()
        counter = TokenCounter.load(tokenizer) if tokenizer else None
        meta = {"format": STORE_FORMAT, "embedder": embedder_name, "dim": dim, "metric": "COSINE",
                "bm25_language": language,
                "tokens": {"tokenizer": tokenizer, "key": counter.key} if counter is not None and counter.key else None}
        self._create(_SCHEMA, {"vector": dim}, language, {**meta, "status": "building"})
        started = time.perf_counter()
        step = max(batch_size * 8, 512)  # passages embedded and inserted at a time
        with tqdm(total=len(rows), unit="passage", desc="passages", disable=not progress) as bar:
            for start in range(0, len(rows), step):
                part = rows[start : start + step]
                vectors = encode(embedder, [t for _, _, t in part], batch_size)
                counts = counter.counts([t for _, _, t in part]) if meta["tokens"] else [0] * len(part)
                self._insert([{"pk": pid, "doc_id": doc, "text": text, "vector": vec.tolist(), "tokens": n}
                              for (pid, doc, text), vec, n in zip(part, vectors, counts, strict=True)])
                bar.update(len(part))
        self._finish(meta)
        seconds = time.perf_counter() - started
        if progress:
            print(f"stored {len(rows)} passages ({embedder_name}, dim {dim}, bm25 {language}) in {seconds:.1f} s "
                  f"({len(rows) / max(seconds, 1e-9):.1f} passages/s) -> {self.uri}", file=sys.stderr)
        return len(rows)

    def count(self) -> int:
        """Passages stored."""
        return self._count()

    def embed_query(self, query: str) -> list[float]:
        """The query's unit vector from this store's embedder (checked against the stored dimension)."""
        return self._encode_query(self.embedder, query, self.meta["dim"], self.meta["embedder"]).tolist()

    def knn(self, vector: Sequence[float], k: int, with_vectors: bool = True) -> list[PassageHit]:
        """The ``k`` passages most similar to ``vector`` (cosine), best first (with their stored
        vectors unless ``with_vectors=False``, which spares the transfer when they are not needed)."""
        self._check_limit("k", k)
        if len(vector) != self.meta["dim"]:
            raise PassageStoreError(f"the query vector has {len(vector)} dimensions, the store {self.meta['dim']}",
                                    f"embed the query with {self.meta['embedder']!r}")
        (results,) = self._client.search(self.collection, data=[list(vector)], anns_field="vector", limit=k,
                                         output_fields=[*self._fields, "vector"] if with_vectors else self._fields,
                                         search_params={"metric_type": "COSINE"})
        return self._hits([(r["entity"], float(r["distance"])) for r in results])

    def bm25(self, query: str, k: int, with_vectors: bool = True) -> list[PassageHit]:
        """The ``k`` passages that best match ``query`` by BM25, best first (none when no term
        matches), with their stored dense vectors unless ``with_vectors=False``."""
        self._check_query(query)
        self._check_limit("k", k)
        _ = self.meta  # refuse an unfinished or foreign collection before searching it
        self.require_bm25("a BM25 search of the passages (MeVe's fallback)", "set fallback=false")
        found = bm25_search(self._client, self.collection, query, k,
                            output_fields=[*self._fields, "vector"] if with_vectors else self._fields)
        return self._hits(found)

    def vectors(self, ids: Iterable[str]) -> dict[str, np.ndarray]:
        """The stored unit vectors of ``ids`` (every id must exist)."""
        return self.stored_vectors(ids, "ask for ids that a search returned, or rebuild the store")
