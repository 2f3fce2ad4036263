"""Benchmark: several methods' memories of the same gold documents, scored side by side against the gold boundaries.

    .venv/bin/python scripts/bench_segmentation.py --gold tests/eval/assets/gold_segments_small.jsonl \\
        --method fixed=artifacts/runs/segmentation-demo/segmentation/methods/fixed/memories.jsonl \\
        --method sentence=artifacts/runs/segmentation-demo/segmentation/methods/sentence/memories.jsonl \\
        --out artifacts/bench/segmentation.json

Each ``--method NAME=memories.jsonl`` is one column of the comparison (any number; the first is the baseline of
the ratio table). Memories are matched to gold documents by ``doc_id`` and must hold exactly the gold texts;
a gold document missing from a memories file stops the run unless ``--allow-missing``. Prints boundary
P / R / F1 (macro, and micro F1), Pk, WindowDiff, chunks per document, mean chunk length and outline ROUGE-L,
then every method's ratio to the first and the signatures; ``--out`` writes all of it (with the per-document
records) as JSON. Definitions: ``eval/segmentation.py`` and docs/EVALUATION.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from _common import method_file

from memreader.core.paths import sha256_file, write_json
from memreader.eval.gold_segments import load_gold_segments, score_memories
from memreader.eval.segmentation import SegmentationSettings, format_table, ratios


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, score every method, print the table and write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gold", required=True, help="gold-boundary JSONL (eval/gold_segments.py)")
    ap.add_argument("--method", action="append", type=method_file, required=True, metavar="NAME=MEMORIES",
                    help="a method's memories JSONL; repeat for each method (the first is the ratio baseline)")
    ap.add_argument("--tolerance", type=int, default=3, help="boundary match tolerance in characters (default 3)")
    ap.add_argument("--window", type=int, default=0,
                    help="Pk / WindowDiff window k in characters (default 0: half the mean gold segment length)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N gold documents (0 = all)")
    ap.add_argument("--allow-missing", action="store_true",
                    help="score the gold documents a memories file has and report the rest as missing")
    ap.add_argument("--out", type=Path, help="write the comparison as JSON here")
    args = ap.parse_args(argv)
    names = [n for n, _ in args.method]
    if len(set(names)) != len(names):
        ap.error(f"a method name is given twice: {names}")
    settings = SegmentationSettings(args.tolerance, args.window)
    if settings.problems():
        ap.error("; ".join(settings.problems()))

    t0 = time.perf_counter()
    gold = load_gold_segments(args.gold, args.limit)
    results = {name: score_memories(gold, path, settings, allow_missing=args.allow_missing)
               for name, path in args.method}
    seconds = time.perf_counter() - t0
    print(f"gold: {args.gold} ({len(gold)} documents)")
    print(format_table(results))
    if args.out:
        base = results[names[0]]
        write_json(args.out, {
            "gold": {"path": str(args.gold), "sha256": sha256_file(args.gold), "n_docs": len(gold)},
            "signature": base.signature,
            "baseline": names[0],
            "ratios": ratios(results),
            "methods": {name: {"memories": str(path), "sha256": sha256_file(path), **results[name].to_dict()}
                        for name, path in args.method},
        })
        print(f"wrote {args.out}")
    print(f"{len(results)} methods x {len(gold)} documents scored in {seconds:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
