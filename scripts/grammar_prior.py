"""What the guided reader's grammar alone gives: memories whose cuts are a random walk through each document's
memory grammar (no model), to score beside the readers (scripts/bench_segmentation.py).

    python scripts/grammar_prior.py --input artifacts/datasets/structure/dev.jsonl \
        --out artifacts/bench/grammar-random.jsonl --max-new-tokens 1024

A guided reader can only cut where the grammar allows (sentence ends inside the chunk-length range, at most
``max_scenarios`` chunks, a path that closes inside the token budget). How much of a reader's boundary score is
the grammar's, and how much the model's? This writes, for every document, the memory of a path drawn uniformly
at random among the allowed ends at each step (seeded), with the grammar settings of
configs/inference/smollm2_cpu.yaml by default. Outline and core are empty: only the cuts are scored. The
graph is built exactly as the reader builds it (``BoundaryGraph.build`` with the record's heading and page
breaks), so a heading-aware corpus gets the same preferred ends.
"""

from __future__ import annotations

import argparse
import json
import random

from memreader.core.corpus import read_corpus
from memreader.core.memory_grammar import BoundaryGraph, GrammarSettings
from memreader.core.schema import DocumentMemory, Scenario, write_memories
from memreader.core.structure import structural_breaks


def random_path(graph: BoundaryGraph, rng: random.Random) -> list[int]:
    """Chunk ends of one uniformly drawn walk from 0 to the document end."""
    ends, s, n = [], 0, len(graph.document)
    while s < n:
        s = rng.choice(graph.edges[s])
        ends.append(s)
    return ends


def main(argv: list[str] | None = None) -> int:
    """Write the random-walk memories; prints one summary line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", required=True, help="corpus JSONL (id, text; heading maps are used as the reader uses them)")
    ap.add_argument("--out", required=True, help="memories JSONL to write")
    ap.add_argument("--min-chunk-chars", type=int, default=150)
    ap.add_argument("--max-chunk-chars", type=int, default=1200)
    ap.add_argument("--max-scenarios", type=int, default=8, help="the reader's max_scenarios (configs/inference/smollm2_cpu.yaml)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    settings = GrammarSettings(min_chunk_chars=args.min_chunk_chars, max_chunk_chars=args.max_chunk_chars,
                               max_scenarios=args.max_scenarios)
    rng = random.Random(args.seed)
    memories = []
    for doc in read_corpus(args.input):
        graph = BoundaryGraph.build(doc.text, settings, structural_breaks(doc.meta))
        ends = random_path(graph, rng)
        scenarios = [Scenario("", "", s, e) for s, e in zip([0, *ends[:-1]], ends, strict=True)]
        memories.append(DocumentMemory(doc.doc_id, doc.text, scenarios,
                                       meta={"method": "grammar-random", "seed": args.seed,
                                             "grammar": {"min_chunk_chars": settings.min_chunk_chars,
                                                         "max_chunk_chars": settings.max_chunk_chars,
                                                         "max_scenarios": settings.max_scenarios}}))
    n = write_memories(args.out, memories)
    chunks = sum(len(m.scenarios) for m in memories)
    print(json.dumps({"memories": n, "chunks_per_doc": round(chunks / max(n, 1), 2), "out": args.out,
                      "settings": vars(args)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
