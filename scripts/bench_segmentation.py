"""Benchmark: several methods' memories of the same gold documents, scored side by side against the gold boundaries.

    .venv/bin/python scripts/bench_segmentation.py --gold tests/eval/assets/gold_segments_small.jsonl \\
        --method fixed=artifacts/runs/segmentation-demo/segmentation/methods/fixed/memories.jsonl \\
        --method sentence=artifacts/runs/segmentation-demo/segmentation/methods/sentence/memories.jsonl \\
        --out artifacts/bench/segmentation.json

Each ``--method NAME=memories.jsonl`` is one column of the comparison (any number; the first is the baseline of
the ratio table). Memories are matched to gold documents by ``doc_id`` and must hold exactly the gold texts;
a gold document missing from a memories file stops the run unless ``--allow-missing``. Prints boundary
P / R / F1 (macro, and micro F1), Pk, WindowDiff, chunks per document, mean chunk length and outline ROUGE-L,
then every method's ratio to the first, every other method's difference to the first in F1 (macro), Pk and
WindowDiff with a paired 95 % bootstrap interval over the documents (:func:`memreader.eval.stats.paired_test`), and
the signatures; ``--out`` writes all of it (with the per-document records) as JSON. Definitions:
``eval/segmentation.py`` and docs/EVALUATION.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from _common import method_file

from memreader.core.paths import sha256_file, write_json
from memreader.eval.gold_segments import load_gold_segments, score_memories
from memreader.eval.segmentation import SegmentationScores, SegmentationSettings, format_table, ratios
from memreader.eval.stats import paired_test

PAIRED = (("f1", "F1"), ("pk", "Pk"), ("window_diff", "WindowDiff"))


def differences(results: dict[str, SegmentationScores], base: str) -> dict[str, dict[str, dict]]:
    """Each method minus ``base`` per document (F1, Pk, WindowDiff), paired over the documents both scored."""
    def column(scores: SegmentationScores, key: str) -> tuple[list[str], list[float]]:
        return [d.doc_id for d in scores.documents], [getattr(d, key) for d in scores.documents]

    return {name: {key: paired_test(*column(scores, key), *column(results[base], key)).to_dict() for key, _ in PAIRED}
            for name, scores in results.items() if name != base}


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
    diffs = differences(results, names[0])
    for name, by_key in diffs.items():
        cells = [f"{label} {by_key[key]['delta']:+.3f} [{by_key[key]['interval']['low']:+.3f}, "
                 f"{by_key[key]['interval']['high']:+.3f}]" for key, label in PAIRED]
        print(f"{name} - {names[0]}: {', '.join(cells)} ({by_key['f1']['n']} documents, paired bootstrap, 95 %)")
    if args.out:
        base = results[names[0]]
        write_json(args.out, {
            "gold": {"path": str(args.gold), "sha256": sha256_file(args.gold), "n_docs": len(gold)},
            "signature": base.signature,
            "baseline": names[0],
            "ratios": ratios(results),
            "differences": diffs,
            "methods": {name: {"memories": str(path), "sha256": sha256_file(path), **results[name].to_dict()}
                        for name, path in args.method},
        })
        print(f"wrote {args.out}")
    print(f"{len(results)} methods x {len(gold)} documents scored in {seconds:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
