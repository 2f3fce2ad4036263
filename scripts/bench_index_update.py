"""An index that follows its memories: a full build against an update after 1% of the documents changed.

    .venv/bin/python scripts/bench_index_update.py                         # 10,000 memories, 1% changed
    .venv/bin/python scripts/bench_index_update.py --memories 2000 --changed 0.05

Memories are generated (nothing downloaded): each of ``--memories`` documents is 3 scenarios of sentences drawn
from the bundled demo corpus (English), with an outline item and a core sentence each, so every row is real text
for the real embedder (MiniLM-L6, the embedded default). Side by side in one run, on Milvus Lite:

1. **full build** of the original memories (``replace=True``);
2. **update** of that index after ``--changed`` of the documents are edited (their core content and one chunk
   boundary move), as many are removed (``prune``) and as many added: ``replace=False``;
3. **fresh build** over the new memories, and every search mode's top 8 for ``--queries`` questions compared
   between the updated and the fresh index: for each dense mode every list it fuses (documents, scenarios, chunk
   texts, similarities to 1e-4, hits equal at that precision taken as a set) and the chunks it returns; the rows
   (same primary keys) and the largest difference of a stored vector. The dense modes must agree (exit 1
   otherwise); the BM25 modes are reported with how far their scores drift, since Milvus Lite counts deleted
   rows in its BM25 statistics until a rebuild.

Printed: seconds of each, the update's share of a full build (target <= 5%), rows written, and whether the
updated index answers exactly as the fresh one.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memreader.core.runtime import load_embedder
from memreader.core.schema import DocumentMemory, Scenario
from memreader.retrieval.index import MODES, MemoryIndex
from memreader.retrieval.milvus import connect, disconnect

ROOT = Path(__file__).resolve().parents[1]

DEMO = ROOT / "memreader" / "demo_data" / "corpus.jsonl"


def sentences() -> list[str]:
    texts = [json.loads(line)["text"] for line in DEMO.read_text(encoding="utf-8").splitlines()]
    return [s.strip() + "." for t in texts for s in t.replace("\n", " ").split(".") if len(s.strip()) > 20
            and s.isascii()]


def memory(doc_id: str, rng: random.Random, pool: list[str]) -> DocumentMemory:
    """Three scenarios; outline items and cores are random word draws, so exact ties between rows are rare."""
    words = sorted({w.strip(".,;:").lower() for s in pool for w in s.split() if len(w) > 3})
    document, scenarios = "", []
    for _ in range(3):
        chunk = " ".join(rng.choice(pool) for _ in range(rng.randint(3, 5))) + " "
        scenarios.append(Scenario(" ".join(rng.sample(words, 5)), " ".join(rng.sample(words, 12)) + ".",
                                  len(document), len(document) + len(chunk)))
        document += chunk
    mem = DocumentMemory(doc_id, document, scenarios)
    mem.validate()
    return mem


def edited(mem: DocumentMemory, rng: random.Random, pool: list[str]) -> DocumentMemory:
    mem = copy.deepcopy(mem)
    mem.scenarios[1].core = rng.choice(pool) + " " + mem.scenarios[1].core
    cut = mem.scenarios[0].end - 1  # move one boundary: the tiling still holds
    mem.scenarios[0].end, mem.scenarios[1].start = cut, cut
    mem.validate()
    return mem


def answers(index: MemoryIndex, queries: list[str]) -> dict[str, list]:
    """Per dense mode and question, each list the mode fuses: (rounded similarity, doc, scenario, text), in
    order of similarity and, among hits equal to 1e-4, of key (so float noise in the last digits of a vector,
    from the texts an embedding batch held, does not count as a difference), and the fused chunks."""
    out: dict[str, list] = {}
    for mode in ("three_layer", "single", "chunk_only"):
        rows = []
        for q in queries:
            lists = index.search_lists(q, MODES[mode], 8)
            rows.append(([sorted((-round(h.similarity, 4), h.doc_id, h.scenario, h.text) for h in hits)
                          for hits in lists], sorted((h.doc_id, h.scenario) for h in index.search(q, 8, mode))))
        out[mode] = rows
    return out


def iter_rows(index: MemoryIndex, output_fields: list[str], batch_size: int = 4096) -> Iterator[dict[str, Any]]:
    """Every stored row of ``index`` with ``output_fields``, fetched ``batch_size`` at a time through Milvus's query
    iterator on a client of its own: a full scan."""
    client = connect(index.uri)
    it = client.query_iterator(index.collection, batch_size=batch_size, output_fields=output_fields)
    try:
        while rows := it.next():
            yield from rows
    finally:
        it.close()
        disconnect(client, index.uri)


def vector_drift(a: MemoryIndex, b: MemoryIndex) -> tuple[bool, float]:
    """(same primary keys in both, largest absolute difference of a stored vector component between them)."""
    import numpy as np

    def vectors(index: MemoryIndex) -> dict[str, np.ndarray]:
        return {r["pk"]: np.asarray(r["vector"], dtype=np.float32) for r in iter_rows(index, ["pk", "vector"])}

    va, vb = vectors(a), vectors(b)
    return va.keys() == vb.keys(), max((float(np.abs(va[k] - vb[k]).max()) for k in va.keys() & vb.keys()),
                                       default=0.0)


def bm25_drift(a: MemoryIndex, b: MemoryIndex, queries: list[str]) -> tuple[float, float]:
    """(share of chunk-BM25 top-8 lists ranked the same, largest relative score difference) between two indexes."""
    same, worst = 0, 0.0
    for q in queries:
        la, lb = a.search_bm25(q, "chunk", 8), b.search_bm25(q, "chunk", 8)
        same += [h.key for h in la] == [h.key for h in lb]
        scores = {h.key: h.similarity for h in lb}
        worst = max([worst] + [abs(h.similarity - scores[h.key]) / scores[h.key] for h in la if h.key in scores])
    return same / len(queries), worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--memories", type=int, default=10_000)
    ap.add_argument("--changed", type=float, default=0.01, help="share of documents edited (and removed, and added)")
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng, pool = random.Random(args.seed), sentences()
    old = [memory(f"doc-{i:06d}", rng, pool) for i in range(args.memories)]
    n = max(1, round(args.memories * args.changed))
    picked = rng.sample(range(args.memories), 2 * n)
    edit, drop = set(picked[:n]), set(picked[n:])
    new = [edited(m, rng, pool) if i in edit else m for i, m in enumerate(old) if i not in drop]
    new += [memory(f"new-{i:06d}", rng, pool) for i in range(n)]
    queries = [" ".join(rng.choice(pool).split()[:8]) for _ in range(args.queries)]
    embedder = load_embedder("minilm-l6", device="cpu")
    kw = {"embedder_name": "minilm-l6", "batch_size": args.batch_size, "progress": False}
    with tempfile.TemporaryDirectory() as tmp:
        with MemoryIndex(Path(tmp) / "updated.db") as index:
            t = time.perf_counter()
            full = index.build(old, embedder, **kw)
            full_s = time.perf_counter() - t
            t = time.perf_counter()
            update = index.build(new, embedder, replace=False, prune=True, **kw)
            update_s = time.perf_counter() - t
            got = answers(index, queries)
            counts = index.counts()
            with MemoryIndex(Path(tmp) / "fresh.db") as fresh:
                t = time.perf_counter()
                fresh.build(new, embedder, **kw)
                fresh_s = time.perf_counter() - t
                want = answers(fresh, queries)
                same_counts = fresh.counts() == counts
                bm25_same, bm25_worst = bm25_drift(index, fresh, queries)
                same_keys, worst_vector = vector_drift(index, fresh)
    same = {mode: got[mode] == want[mode] for mode in got}
    print(f"memories {args.memories}, changed {n} edited + {n} removed + {n} added ({args.changed:.1%} each); "
          f"MiniLM-L6 on CPU, Milvus Lite, batch_size {args.batch_size}")
    print(f"full build   {full_s:8.1f} s  {full.total_rows} rows ({full.total_rows / full_s:.0f} rows/s)")
    print(f"update       {update_s:8.1f} s  {update.total_rows} rows written; "
          + ", ".join(f"{k} {v}" for k, v in update.plan.counts().items()))
    print(f"fresh build  {fresh_s:8.1f} s  (over the new memories)")
    print(f"update / full build = {update_s / full_s:.2%} (target <= 5%)")
    print("updated index answers as the fresh build: " + ", ".join(f"{m} {'same' if s else 'DIFFERENT'}"
                                                                   for m, s in same.items())
          + f"; rows per layer {'same' if same_counts else 'DIFFERENT'}; primary keys "
          f"{'same' if same_keys else 'DIFFERENT'}; stored vectors within {worst_vector:.1e}")
    print(f"chunk BM25 top 8: {bm25_same:.0%} of lists ranked the same, scores within {bm25_worst:.2%} "
          "(Milvus Lite keeps deleted rows in its BM25 statistics: it has no compaction)")
    return 0 if all(same.values()) and same_counts and same_keys else 1


if __name__ == "__main__":
    raise SystemExit(main())
