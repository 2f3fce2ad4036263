"""Where a guided reader cuts, decision by decision, against the gold section starts.

    python scripts/profile_cuts.py --gold artifacts/datasets/structure/dev.jsonl \
        --method base=artifacts/runs/seg-base/read/memories.jsonl \
        --method trained=artifacts/runs/seg-trained/read/memories.jsonl --out artifacts/bench/cut_profile.json

A guided reader makes one decision per chunk: from the chunk's start, which of the grammar's allowed ends
(sentence ends inside the chunk-length range) becomes its end. This script rebuilds each document's grammar
graph with the reader's settings (configs/inference/smollm2_cpu.yaml by default) and, for every decision of
every memory, records how many ends were allowed, whether a gold section start was among them, whether the
chosen end is one, and where the chosen and the gold end sit among the allowed ends (relative rank: 0 = the
earliest allowed end, 1 = the latest). It answers: does the model choose where the topic changes, or does it
follow a position (always early, always late), and how often does one wrong cut put the next decisions out of
reach of the gold ones? A decision from a start the graph does not know (the memory took a path the grammar
would not) is counted apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from _common import method_file

from memreader.core.memory_grammar import BoundaryGraph, GrammarSettings, past_space
from memreader.core.schema import read_memories


def profile(gold: dict[str, dict], memories: list, settings: GrammarSettings) -> dict:
    """The decision profile of one method's memories (module docstring)."""
    rows, off_graph = [], 0
    for mem in memories:
        rec = gold.get(mem.doc_id)
        if rec is None:
            continue
        text = rec["text"]
        graph = BoundaryGraph.build(text, settings)
        golds = {past_space(text, b) for b in rec["boundaries"]}
        n = len(text)
        on_track = True
        for sc in mem.scenarios[:-1]:
            ends = [e for e in graph.edges.get(sc.start, []) if e < n]
            if not ends:
                off_graph += 1
                continue
            gold_here = [e for e in ends if e in golds]

            def rank(e: int, ends: list[int] = ends) -> float:
                return ends.index(e) / (len(ends) - 1) if len(ends) > 1 else 0.5

            rows.append({"allowed": len(ends), "gold_available": bool(gold_here), "chosen_gold": sc.end in golds,
                         "chosen_rank": rank(sc.end) if sc.end in ends else None,
                         "gold_rank": rank(gold_here[0]) if gold_here else None,
                         "after_a_miss": not on_track})
            on_track = sc.end in golds
    avail = [r for r in rows if r["gold_available"]]
    ranks = [r["chosen_rank"] for r in rows if r["chosen_rank"] is not None]
    gold_ranks = [r["gold_rank"] for r in avail]

    def share(xs: list, key: str) -> float | None:
        return round(sum(1 for x in xs if x[key]) / len(xs), 4) if xs else None

    def quart(xs: list[float]) -> list[float] | None:
        return [round(q, 3) for q in statistics.quantiles(xs, n=4)] if len(xs) > 3 else None

    return {
        "decisions": len(rows), "off_graph": off_graph,
        "mean_allowed_ends": round(statistics.mean(r["allowed"] for r in rows), 2) if rows else None,
        "gold_available": share(rows, "gold_available"),
        "hit_when_available": share(avail, "chosen_gold"),
        "chance_when_available": round(statistics.mean(1 / r["allowed"] for r in avail), 4) if avail else None,
        "hit_when_available_after_a_hit": share([r for r in avail if not r["after_a_miss"]], "chosen_gold"),
        "hit_when_available_after_a_miss": share([r for r in avail if r["after_a_miss"]], "chosen_gold"),
        "gold_available_after_a_miss": share([r for r in rows if r["after_a_miss"]], "gold_available"),
        "chosen_rank_mean": round(statistics.mean(ranks), 3) if ranks else None,
        "chosen_rank_quartiles": quart(ranks),
        "gold_rank_mean": round(statistics.mean(gold_ranks), 3) if gold_ranks else None,
        "gold_rank_quartiles": quart(gold_ranks),
    }


def main(argv: list[str] | None = None) -> int:
    """Profile every method; prints one table and writes the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gold", required=True, help="gold JSONL (id, text, boundaries)")
    ap.add_argument("--method", action="append", required=True, type=method_file, metavar="NAME=MEMORIES",
                    help="a method's memories of the gold texts (repeat)")
    ap.add_argument("--min-chunk-chars", type=int, default=150)
    ap.add_argument("--max-chunk-chars", type=int, default=1200)
    ap.add_argument("--max-scenarios", type=int, default=8)
    ap.add_argument("--out", default="", help="JSON output")
    args = ap.parse_args(argv)
    gold = {}
    for line in open(args.gold, encoding="utf-8"):
        if line.strip():
            rec = json.loads(line)
            gold[rec["id"]] = rec
    settings = GrammarSettings(min_chunk_chars=args.min_chunk_chars, max_chunk_chars=args.max_chunk_chars,
                               max_scenarios=args.max_scenarios)
    out = {"settings": {k: getattr(settings, k) for k in ("min_chunk_chars", "max_chunk_chars", "max_scenarios")},
           "methods": {}}
    for name, path in args.method:
        out["methods"][name] = profile(gold, read_memories(path), settings)
    cols = ["decisions", "mean_allowed_ends", "gold_available", "hit_when_available", "chance_when_available",
            "hit_when_available_after_a_hit", "hit_when_available_after_a_miss", "chosen_rank_mean", "gold_rank_mean"]
    print("method".ljust(16) + "".join(c[:14].rjust(15) for c in cols))
    for name, p in out["methods"].items():
        print(name.ljust(16) + "".join(str(p[c]).rjust(15) for c in cols))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
