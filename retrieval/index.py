"""The memory index: document memories as vectors in Milvus, one collection with a row per scenario and layer.

Milvus Lite (a local ``.db`` file) or a server URI, through :class:`~memreader.retrieval.milvus.MilvusCollection`.
Rows are made by :mod:`memreader.retrieval.rows`; BM25 by :mod:`memreader.retrieval.lexical`; search modes
in :data:`MODES`. :meth:`MemoryIndex.build` drops and recreates the collection, or with ``replace=False`` updates
it in place by content hash (:mod:`memreader.retrieval.updates`).
Details (the one-collection schema decision, modes, batched search): docs/RETRIEVAL.md (The index, Search modes).
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pymilvus import DataType
from tqdm import tqdm

from memreader.core.embedders import EMBED_BATCH
from memreader.core.fusion import (
    ALL_LAYERS,
    BM25,
    CHUNK,
    CORE,
    LAYERS,
    OUTLINE,
    RRF_K,
    SINGLE,
    ChunkKey,
    Hit,
    LayerHit,
    bm25_label,
    fuse_layer_hits,
    rank_hits,
    split_by_layer,
    split_label,
)
from memreader.core.schema import DocumentMemory
from memreader.retrieval.lexical import bm25_search, resolve_language
from memreader.retrieval.milvus import CONNECT_TIMEOUT, MAX_LIMIT, MilvusCollection, string_literal
from memreader.retrieval.rows import (
    MAX_DOC_ID_BYTES,
    MAX_ORIGIN_BYTES,
    BuildSummary,
    Embedder,
    MemoryIndexError,
    ScenarioTexts,
    embed_rows,
    embedding_dim,
    memory_hash,
    primary_key,
    scenario_texts,
)
from memreader.retrieval.updates import (
    UpdatePlan,
    delete_docs,
    delete_other_versions,
    indexed_versions,
    newest_only,
)

__all__ = ["DEFAULT_COLLECTION", "MODES", "BuildSummary", "MemoryIndex", "MemoryIndexError"]

log = logging.getLogger(__name__)

DEFAULT_COLLECTION = "memreader_memories"
INDEX_FORMAT = 3  # 2: a BM25 sparse field over ``text``; 3: doc_hash, generation and origin per row
MODES: dict[str, tuple[str, ...]] = {
    "three_layer": LAYERS,
    "single": (SINGLE,),
    "chunk_only": (CHUNK,),
    "hybrid": (*LAYERS, *(bm25_label(layer) for layer in LAYERS)),
    "chunk_hybrid": (CHUNK, bm25_label(CHUNK)),
}
"""Search modes and the ranked lists each one fuses: a layer name is that layer's vector search,
``<layer>/bm25`` its BM25 search (``hybrid``: all six; ``chunk_hybrid``: chunk vectors + chunk BM25)."""
_HAS_TERM = re.compile(r"\w", re.UNICODE)  # a BM25 query needs a word character to match on
_DENSE_FIX = "search with mode three_layer, single or chunk_only (vectors only)"
_UNION_DEPTH = 4  # a batched search asks for 4x the rows its layers need, so a layer rarely needs its own
_SCHEMA = [("pk", DataType.VARCHAR, {"is_primary": True, "max_length": 512}),
           ("layer", DataType.VARCHAR, {"max_length": 16, "is_partition_key": True}),
           ("doc_id", DataType.VARCHAR, {"max_length": MAX_DOC_ID_BYTES}),
           ("scenario", DataType.INT64, {}), ("start", DataType.INT64, {}), ("end", DataType.INT64, {}),
           ("doc_hash", DataType.VARCHAR, {"max_length": 64}), ("generation", DataType.INT64, {}),
           ("origin", DataType.VARCHAR, {"max_length": MAX_ORIGIN_BYTES})]
_OUTPUT_FIELDS = ["doc_id", "scenario", "start", "end", "text", "doc_hash", "generation", "origin", "layer"]


def _hit(label: str, score: float, entity: dict[str, Any]) -> LayerHit:
    """An unranked hit (rank 0) from a Milvus entity."""
    return LayerHit(layer=label, rank=0, similarity=score, doc_id=entity["doc_id"], scenario=int(entity["scenario"]),
                    start=int(entity["start"]), end=int(entity["end"]), text=entity["text"],
                    version=entity["doc_hash"], generation=int(entity["generation"]), origin=entity["origin"])


class MemoryIndex(MilvusCollection):
    """Document memories in one Milvus collection: build it, search it by layer, fuse the layers.

    Use as a context manager (or call :meth:`close`): Milvus Lite serves each open file from this
    process. ``embedder`` is the sentence-transformers model used for queries (and builds);
    ``embedder_name``, when given, must be the name the index was built with (vectors of two
    embedders are not comparable even at the same dimension). ``batch_layers`` (default) asks Milvus once
    for all the layers a query searches (:meth:`search_lists`); ``False`` sends one search per layer.
    """

    KIND = "index"
    META_KEY = "memreader.index"
    VERSION = INDEX_FORMAT
    MISSING_FIX = "run `memreader index` first to build it"
    REBUILD_FIX = "rebuild it with `memreader index`"
    error = MemoryIndexError
    union_depth: int = _UNION_DEPTH
    """Rows a batched search (``batch_layers``) asks for, per layer searched and per result wanted; a layer the
    answer holds too few rows of gets its own search. Set on an instance to measure another depth
    (``scripts/bench_layer_latency.py --union-depth``)."""

    def __init__(self, uri: str | Path, collection: str = DEFAULT_COLLECTION, embedder: Embedder | None = None,
                 token: str = "", must_exist: bool = False, timeout: float = CONNECT_TIMEOUT,
                 embedder_name: str | None = None, batch_layers: bool = True) -> None:
        super().__init__(uri, collection, token, timeout, must_exist)
        self.embedder = embedder
        self.embedder_name = embedder_name
        self.batch_layers = batch_layers

    @classmethod
    def open(cls, uri: str | Path, collection: str = DEFAULT_COLLECTION, embedder: Embedder | None = None, token: str = "",
             timeout: float = CONNECT_TIMEOUT, embedder_name: str | None = None, batch_layers: bool = True
             ) -> MemoryIndex:
        """Open an existing, completely built index for searching (refused if ``embedder_name``
        is given and differs from the embedder it was built with)."""
        index = cls(uri, collection, embedder, token=token, must_exist=True, timeout=timeout,
                    embedder_name=embedder_name, batch_layers=batch_layers)
        with index._closing_on_error():
            index._check_embedder(embedder_name, index.meta["embedder"])
            index.load()
        return index

    def counts(self) -> dict[str, int]:
        """Rows per layer."""
        return {layer: self._count(f"layer == {string_literal(layer)}") for layer in ALL_LAYERS}

    def build(self, memories: Iterable[DocumentMemory], embedder: Embedder | None = None, batch_size: int = EMBED_BATCH,
              embedder_name: str = "unnamed", replace: bool = True, progress: bool = True, bm25_language: str = "auto",
              prune: bool = False) -> BuildSummary:
        """Embed and write the outline, core, chunk and single rows of every scenario.

        ``replace=False`` updates by content hash (creating the collection if missing; ``prune`` deletes the
        documents the input lacks; the summary's ``plan`` says what changed). ``embedder_name`` is recorded so that
        queries use the same model; ``bm25_language`` picks the analyzer when the collection is created. The whole
        input is validated first; a full build that stops half-way leaves the index marked unfinished, and opening
        it then says so; an update that stops half-way leaves the old versions searchable.
        """
        embedder = embedder or self.embedder
        if embedder is None:
            raise MemoryIndexError("build needs an embedder", "pass embedder= (e.g. memreader.core.runtime.load_embedder())")
        if batch_size < 1:
            raise MemoryIndexError(f"batch_size must be >= 1, got {batch_size}")
        # Validate the whole input before touching the collection: bad input never costs an index.
        texts, hashes, skipped = _validated_texts(memories)
        self.embedder = embedder
        dim = embedding_dim(embedder)
        exists = self._client.has_collection(self.collection)
        update = exists and not replace
        if update:
            old = self._updatable(embedder_name, dim)
            self._client.load_collection(self.collection)  # a reopened collection starts out released
            language, generation = old["bm25_language"], int(old["generation"]) + 1
            deleted_before = int(old.get("deleted_rows", 0))
        else:
            language = resolve_language(bm25_language, (s.texts.get(CHUNK, "") for doc in texts.values() for s in doc))
            generation = 1
        meta = {"format": INDEX_FORMAT, "embedder": embedder_name, "dim": dim, "metric": "COSINE",
                "bm25_language": language, "generation": generation,
                "deleted_rows": deleted_before if update else 0}
        summary = BuildSummary(uri=self.uri, collection=self.collection, embedder=embedder_name)
        started = time.perf_counter()
        if update:
            # Rows of an update that never committed are invisible; drop them (counted) before writing anew.
            deleted_before += self._count(f"generation >= {generation}")
            self._client.delete(self.collection, filter=f"generation >= {generation}")
            plan = UpdatePlan.between(indexed_versions(self._client, self.collection, generation - 1), hashes, prune)
        else:
            if exists:
                self._drop()
            self._create(_SCHEMA, {"vector": dim}, language, {**meta, "status": "building"})
            plan = UpdatePlan(added=sorted(texts))
        summary.plan, summary.update = plan, update
        self._write_docs([texts[d] for d in sorted(plan.added + plan.replaced)], embedder, batch_size, generation, summary, progress)
        if update:
            self._commit_update(meta, plan, generation, deleted_before, summary)
        else:
            self._finish(meta)
        summary.documents = len(texts)
        summary.skipped = dict(skipped)
        summary.seconds = time.perf_counter() - started
        log.info(summary.line())  # `memreader index` prints it
        return summary

    def _commit_update(self, meta: dict[str, Any], plan: UpdatePlan, generation: int, deleted_before: int,
                       summary: BuildSummary) -> None:
        """Make an update's rows visible (the meta record is the commit), then delete what they replace."""
        self._flush()
        self._write_meta({**meta, "status": "complete"})  # the commit: the new rows become visible
        deleted = (delete_docs(self._client, self.collection, plan.replaced, f"generation < {generation}")
                   + delete_docs(self._client, self.collection, plan.removed)
                   + delete_other_versions(self._client, self.collection, plan.leftovers))
        self._flush()
        meta["deleted_rows"] = deleted_before + deleted
        self._write_meta({**meta, "status": "complete"})
        summary.deleted_rows, summary.live_rows = meta["deleted_rows"], self._count()

    def _updatable(self, embedder_name: str, dim: int) -> dict[str, Any]:
        """The record of an index that an update may write to, or the error saying why not and how to rebuild."""
        fix = "rebuild it: memreader index --set replace=true"
        try:
            old = self.meta
        except MemoryIndexError as exc:
            raise MemoryIndexError(f"cannot update: {exc}", fix) from None
        if (old["embedder"], old["dim"]) != (embedder_name, dim):
            raise MemoryIndexError(
                f"{self._where()} holds {old['embedder']} vectors (dim {old['dim']}), not {embedder_name} (dim {dim}): "
                "an update (or --prune) cannot mix them", f"index with embedder={old['embedder']}, or {fix}")
        return old

    def _write_docs(self, docs: list[list[ScenarioTexts]], embedder: Embedder, batch_size: int, generation: int,
                    summary: BuildSummary, progress: bool) -> None:
        """Embed and insert the rows of ``docs`` (each a memory's scenarios), flushing every few batches."""
        flush_texts = max(batch_size * 8, 256)
        pending: list[ScenarioTexts] = []
        written = 0
        with tqdm(total=len(docs), unit="doc", desc="index", disable=not progress) as bar:
            for i, scenarios in enumerate(docs, start=1):
                pending.extend(scenarios)
                if sum(len(s.texts) for s in pending) >= flush_texts or i == len(docs):
                    rows = embed_rows(pending, embedder, batch_size, generation)
                    self._insert(rows)
                    summary.scenarios += len(pending)
                    for row in rows:
                        summary.rows[row["layer"]] += 1
                    bar.update(i - written)
                    pending, written = [], i

    def _visible(self) -> str:
        """The filter that hides the rows of an update not yet committed; the record is read again, since an
        update may have committed since the last search."""
        self._meta = None
        return f"generation <= {int(self.meta['generation'])}"

    def embed_query(self, query: str) -> list[float]:
        """The query's unit vector, from the index's embedder (checked against the index dimension)."""
        self._check_query(query)
        self._check_embedder(self.embedder_name, self.meta["embedder"])
        return self._encode_query(self.embedder, query, self.meta["dim"], self.meta["embedder"]).tolist()

    def search_layer(self, vector: Sequence[float], layer: str, limit: int, visible: str = "") -> list[LayerHit]:
        """The ``limit`` rows of one layer most similar to ``vector``, best first (ranks 1..n); ``visible`` is a
        caller's :meth:`_visible` filter of the same search (read afresh when not given)."""
        if layer not in ALL_LAYERS:
            raise ValueError(f"unknown layer {layer!r}; choose from {', '.join(ALL_LAYERS)}")
        self._check_limit("limit", limit)
        return newest_only([rank_hits(self._search_vector(vector, [layer], limit, visible or self._visible()), limit)])[0]

    def search_bm25(self, query: str, layer: str, limit: int, visible: str = "") -> list[LayerHit]:
        """The ``limit`` rows of one layer that best match ``query`` by BM25, best first (ranks 1..n).

        Hits are labelled ``<layer>/bm25`` and ``similarity`` holds the BM25 score (positive,
        unbounded). An empty query is refused; one without a word character (only punctuation)
        gives an empty list without asking Milvus: a tokenizer that keeps punctuation (jieba) would
        otherwise match it against every row holding that punctuation.
        """
        if layer not in LAYERS:
            raise ValueError(f"BM25 searches a text layer: choose from {', '.join(LAYERS)}, not {layer!r}")
        self._check_query(query)
        self._check_limit("limit", limit)
        visible = visible or self._visible()  # also refuses an unfinished or foreign collection before searching
        self.require_bm25(f"a BM25 search of the {layer} layer", _DENSE_FIX)
        if not _HAS_TERM.search(query):
            return []
        return newest_only([rank_hits(self._search_text(query, [layer], limit, visible), limit)])[0]

    def chunk_texts(self, hits: Iterable[LayerHit]) -> dict[ChunkKey, str]:
        """The chunk text of each hit's scenario (of the hit's version), fetched by primary key."""
        keys = {h.key: primary_key(CHUNK, h.scenario, h.doc_id, h.version) for h in hits}
        rows = self.rows_by_pk(list(keys.values()), ["doc_id", "scenario", "text"])
        found = {(r["doc_id"], int(r["scenario"])): r["text"] for r in rows}
        missing = [k for k in keys if k not in found]
        if missing:
            raise MemoryIndexError(f"{self._where()} has no chunk row for {missing[:3]}; it is inconsistent",
                                   self.REBUILD_FIX)
        return found

    def layer_texts(self, hits: Iterable[Hit]) -> dict[ChunkKey, dict[str, str]]:
        """The outline item and core content of each hit's scenario (``{}`` for a layer whose row was skipped as
        blank), fetched by primary key from the hit's own version."""
        keys = {}
        for h in hits:
            version = h.provenance[0].version if h.provenance else ""
            for layer in (OUTLINE, CORE):
                keys[primary_key(layer, h.scenario, h.doc_id, version)] = ((h.doc_id, h.scenario), layer)
        out: dict[ChunkKey, dict[str, str]] = {key: {} for key, _ in keys.values()}
        for r in self.rows_by_pk(list(keys), ["pk", "text"]):
            key, layer = keys[r["pk"]]
            out[key][layer] = r["text"]
        return out

    def search_lists(self, query: str, labels: Sequence[str], limit: int) -> list[list[LayerHit]]:
        """One ranked list per label (see :data:`MODES`): ``chunk`` is the chunk layer's vector
        search, ``chunk/bm25`` its BM25 search; ``limit`` rows each, best first (ranks 1..n).

        With ``batch_layers`` the vector lists come from one Milvus search over all their layers and
        the BM25 lists from one more (Milvus Lite spends most of a search on work proportional to
        the collection, not to the layers asked for; a server saves round trips). Each list is
        still its layer's exact top ``limit`` (:func:`memreader.core.fusion.split_by_layer`).
        """
        self._check_query(query)
        self._check_limit("limit", limit)
        parsed = [split_label(label) for label in labels]
        for layer, signal in parsed:
            if layer not in (LAYERS if signal == BM25 else ALL_LAYERS):
                raise ValueError(f"no {signal} list for layer {layer!r}: use {', '.join(MODES['hybrid'])} or {SINGLE}")
        dense = [layer for layer, signal in parsed if signal != BM25]
        lexical = [layer for layer, signal in parsed if signal == BM25]
        found: dict[str, list[LayerHit]] = {}
        visible = self._visible()
        if lexical:  # before the query is embedded
            self.require_bm25(f"the BM25 lists {', '.join(bm25_label(layer) for layer in lexical)}", _DENSE_FIX)
        if dense:
            vector = self.embed_query(query)
            found.update(self._split_by_layer(dense, limit, lambda n: self._search_vector(vector, dense, n, visible),
                                              lambda layer: self.search_layer(vector, layer, limit, visible)))
        if lexical:
            found.update((bm25_label(layer), hits) for layer, hits in self._split_by_layer(
                lexical, limit, lambda n: self._search_text(query, lexical, n, visible),
                lambda layer: self.search_bm25(query, layer, limit, visible), batch=bool(_HAS_TERM.search(query))).items())
        # dense lists are keyed by layer, BM25 ones by label; one version per document (memreader.retrieval.updates)
        return newest_only(found[label] for label in labels)

    def _split_by_layer(self, layers: Sequence[str], limit: int, search_all: Any, search_one: Any, batch: bool = True
                        ) -> dict[str, list[LayerHit]]:
        """Each layer's exact top ``limit`` from ``search_all(n)``, one search for the best ``n`` rows
        of all ``layers`` (:func:`memreader.core.fusion.split_by_layer`); a layer that answer is too
        shallow for gets ``search_one(layer)``, and so does every layer without ``batch_layers`` (or ``batch``)."""
        if not (self.batch_layers and batch and len(layers) > 1):
            return {layer: search_one(layer) for layer in layers}
        n = min(MAX_LIMIT, self.union_depth * limit * len(layers))
        split = split_by_layer(search_all(n), layers, limit, asked=n)
        return {layer: hits if hits is not None else search_one(layer) for layer, hits in split.items()}

    def _search_vector(self, vector: Sequence[float], layers: Sequence[str], limit: int,
                       visible: str) -> list[LayerHit]:
        """The best ``limit`` rows of ``layers`` together by vector similarity (unranked hits)."""
        names = ", ".join(string_literal(layer) for layer in layers)
        (results,) = self._client.search(self.collection, data=[list(vector)], anns_field="vector", limit=limit,
                                         filter=f"layer in [{names}] and {visible}", output_fields=_OUTPUT_FIELDS,
                                         search_params={"metric_type": "COSINE"})
        return [_hit(r["entity"]["layer"], float(r["distance"]), r["entity"]) for r in results]

    def _search_text(self, query: str, layers: Sequence[str], limit: int, visible: str) -> list[LayerHit]:
        """The best ``limit`` rows of ``layers`` together by BM25 (unranked hits, ``<layer>/bm25``).

        BM25 statistics are the collection's, not the filter's, so a row scores the same here as
        in its own layer's search.
        """
        names = ", ".join(string_literal(layer) for layer in layers)
        found = bm25_search(self._client, self.collection, query, limit, filter=f"layer in [{names}] and {visible}",
                            output_fields=_OUTPUT_FIELDS)
        return [_hit(bm25_label(e["layer"]), score, e) for e, score in found]

    def check_mode(self, mode: str) -> None:
        """Refuse an unknown ``mode``, or a hybrid one on an index without BM25 (a Milvus server older than
        2.5), naming the server's version and the modes that work: before any work is done."""
        if mode not in MODES:
            raise ValueError(f"unknown search mode {mode!r}; choose from {', '.join(MODES)}")
        if any(split_label(label)[1] == BM25 for label in MODES[mode]):
            self.require_bm25(f"search mode {mode!r}", _DENSE_FIX)

    def search(self, query: str, top_k: int = 8, mode: str = "three_layer", rrf_k: float = RRF_K) -> list[Hit]:
        """Retrieve the ``top_k`` best chunks for ``query``: the lists of ``mode`` (:data:`MODES`, ``top_k`` rows
        each), every hit mapped to its chunk, fused with RRF (a BM25 list that matches nothing gives no votes)."""
        self.check_mode(mode)
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        try:
            return self._search(query, top_k, mode, rrf_k)
        except MemoryIndexError as exc:
            if "no chunk row" not in str(exc):
                raise
            # an update committed and deleted the version this search had found: search again, once
            return self._search(query, top_k, mode, rrf_k)

    def _search(self, query: str, top_k: int, mode: str, rrf_k: float) -> list[Hit]:
        lists = self.search_lists(query, MODES[mode], top_k)
        fused = fuse_layer_hits(lists, k=rrf_k)[:top_k]
        texts = {h.key: h.text for hits in lists for h in hits if h.base_layer == CHUNK}
        texts.update(self.chunk_texts(provenance[0] for key, _, provenance in fused if key not in texts))
        return [Hit(doc_id=key[0], scenario=key[1], start=prov[0].start, end=prov[0].end, text=texts[key], score=score,
                    provenance=prov, where=prov[0].where) for key, score, prov in fused]


def _validated_texts(memories: Iterable[DocumentMemory]) -> tuple[dict[str, list[ScenarioTexts]], dict[str, str],
                                                                  Counter[str]]:
    """Each document's row texts and content hash, and the scenarios skipped by reason; a doc_id given twice
    is an error (checked for the whole input before the collection is touched)."""
    skipped: Counter[str] = Counter()
    texts: dict[str, list[ScenarioTexts]] = {}
    hashes: dict[str, str] = {}
    for mem in memories:
        if mem.doc_id in texts:
            raise MemoryIndexError(f"doc_id {mem.doc_id!r} occurs twice in the input; doc_ids must be unique")
        texts[mem.doc_id] = scenario_texts(mem, skipped)
        hashes[mem.doc_id] = texts[mem.doc_id][0].doc_hash if texts[mem.doc_id] else memory_hash(mem)
    return texts, hashes, skipped
