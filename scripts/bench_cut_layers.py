"""How many of the base model's layers the cut head needs: the prefill's seconds per layer count, and the features of
several counts computed in one prefill so each count's head can be fitted without prefilling again.

    python scripts/bench_cut_layers.py --counts 6 8 12 --docs artifacts/datasets/structure/train.jsonl \\
        --docs artifacts/datasets/structure/dev.jsonl --time-docs 40
    memreader train --config configs/training/cut_head_structure_cpu.yaml --set cut_layers=8 \\
        --set cut_dir=artifacts/heads/layers8                      # every row read from the cache
    python scripts/bench_cut_layers.py ... (then) scripts/bench_cut_levers.py --no-drop \\
        --head "12=results/structure-adapter/cut_head" --head "8=artifacts/heads/layers8" ...

1. **Time** (``--time-docs`` of the last ``--docs`` file, one warm-up document first): the prefill of each count on
   its own (:meth:`CutFeatures.hidden`, a model cut after that many layers, as a read runs it), seconds per document
   and the ratio to the largest count. Nothing is cached here.
2. **Fill** (every document of every ``--docs`` file): one prefill of the largest count per document gives the hidden
   states after each count (:meth:`CutFeatures.hidden_at`: a layer's output through the final norm is exactly what
   the shorter model gives), and the rows go into ``--cache`` under the key that features of that count read
   (:func:`memreader.core.cut_features.cache_layer_counts`), so ``memreader train`` with ``cut_layers=N`` and
   ``scripts/bench_cut_levers.py`` find them. Counts already cached for a document are skipped (a rerun resumes).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tqdm import tqdm

from memreader.core.cut_features import CutFeatures, cache_layer_counts, cut_dtype, missing_layer_counts
from memreader.core.hardware import cpu_flags, cpu_model
from memreader.core.registry import SMOLLM2
from memreader.training.cut_fit import load_gold


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", type=int, nargs="+", required=True, help="layer counts to compare (e.g. 6 8 12)")
    ap.add_argument("--docs", action="append", required=True, help="gold JSONL whose features to cache (repeat)")
    ap.add_argument("--model", default=SMOLLM2)
    ap.add_argument("--cache", default="artifacts/cache/cut_features")
    ap.add_argument("--time-docs", type=int, default=40, help="documents the prefill of each count is timed on (0 = skip)")
    ap.add_argument("--dtype", default="float32", help="the prefill's dtype (auto, float32, bfloat16)")
    ap.add_argument("--no-fill", action="store_true", help="time only")
    ap.add_argument("--out", default="artifacts/bench/cut_layers.json")
    args = ap.parse_args()
    counts = sorted(set(args.counts))
    dtype = cut_dtype(args.dtype)
    report: dict = {"counts": counts, "dtype": dtype, "cpu": f"{cpu_model()} ({' '.join(cpu_flags())})",
                    "docs": args.docs, "time": {}}
    timed = load_gold(args.docs[-1])[: args.time_docs + 1] if args.time_docs else []
    for n in counts if timed else []:
        features = CutFeatures.load(args.model, n, dtype=dtype)
        features.hidden(timed[0].text)  # warm-up
        t = time.perf_counter()
        for d in timed[1:]:
            features.hidden(d.text)
        report["time"][n] = round((time.perf_counter() - t) / max(1, len(timed) - 1), 4)
        del features
    if report["time"]:
        top = report["time"][counts[-1]]
        print(f"prefill, {len(timed) - 1} documents of {args.docs[-1]} ({dtype}, {report['cpu']}):")
        for n, s in report["time"].items():
            print(f"  {n:>2} layers: {s:.3f} s/document ({s / top:.2f}x {counts[-1]} layers)")
    if not args.no_fill:
        cache = Path(args.cache)
        docs = [d for path in args.docs for d in load_gold(path)]
        keys = CutFeatures.load(args.model, 1, dtype=dtype)  # the model's name and shape for the cache keys
        missing = {n for d in docs for n in missing_layer_counts(keys, d.text, cache, counts)}
        del keys
        t, written = time.perf_counter(), 0
        if missing:  # the prefill runs as deep as the deepest count some document lacks
            features = CutFeatures.load(args.model, max(missing), dtype=dtype)
            for d in tqdm(docs, desc=f"cut features ({max(missing)} layers)", unit="doc"):
                written += bool(cache_layer_counts(features, d.text, cache, sorted(missing)))
        report["fill"] = {"documents": len(docs), "prefilled": written, "counts_missing": sorted(missing),
                          "seconds": round(time.perf_counter() - t, 1)}
        print(f"features of {counts} layers: {written} of {len(docs)} documents prefilled "
              f"in {report['fill']['seconds']:.0f} s → {cache}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
