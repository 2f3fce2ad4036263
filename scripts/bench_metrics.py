"""Benchmark: score 10,000 real Chinese pairs with BLEU-1, BLEU-Avg, ROUGE-L and METEOR.

    .venv/bin/python scripts/bench_metrics.py                  # 10,000 pairs, all CPUs, profile mom
    .venv/bin/python scripts/bench_metrics.py --n 2000 --workers 1 --check-all

The pairs come from CRUD-RAG's event-summary file (1,328 news records, ``../shared/datasets``).
Pair ``j`` uses record ``j mod 1328`` and variant ``floor(j / 1328)`` of this list, so 10,000 pairs
cover variants 0-6 in full and part of 7:

    0 event -> summary          1 title -> summary              2 summary -> event
    3 article lead (as many characters as the summary) -> summary
    4 first half of the summary -> summary                      5 event -> title
    6 first sentence of the article -> event                    7 next record's summary -> summary

The run times the whole ``score_pairs`` call (tokenizing, four metrics, bootstrap intervals) after
loading jieba and WordNet, then re-scores an evenly spaced sample one example at a time in this
process, checks the results are identical, and prints the parallel/serial throughput ratio. The numbers in docs/BENCHMARKS.md
come from this script.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from memreader.core.hardware import cpu_cores
from memreader.eval.metrics import prepare, resolve_config, score_example
from memreader.eval.score import score_pairs

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT / ".." / "shared" / "datasets" / "crud_event_summary.jsonl"
VARIANTS = 8


def _first_sentence(text: str) -> str:
    head = text.split("。", 1)[0]
    return head + "。" if len(head) < len(text) else head


def build_pairs(records: list[dict], n: int) -> tuple[list[str], list[str]]:
    """``n`` (prediction, reference) pairs by the scheme in the module docstring."""
    preds, refs = [], []
    count = len(records)
    for j in range(n):
        i, variant = j % count, (j // count) % VARIANTS
        r, nxt = records[i], records[(i + 1) % count]
        summary = r["summary"]
        pred, ref = {
            0: (r["event"], summary),
            1: (r["title"], summary),
            2: (summary, r["event"]),
            3: (r["text"][: len(summary)], summary),
            4: (summary[: len(summary) // 2], summary),
            5: (r["event"], r["title"]),
            6: (_first_sentence(r["text"]), r["event"]),
            7: (nxt["summary"], summary),
        }[variant]
        preds.append(pred)
        refs.append(ref)
    return preds, refs


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print one summary line per phase."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="crud_event_summary.jsonl")
    parser.add_argument("--n", type=int, default=10_000, help="number of pairs (default 10000)")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: all CPUs)")
    parser.add_argument("--profile", default="mom", help="metric profile (default mom)")
    parser.add_argument("--serial-slice", type=int, default=1000, help="pairs re-scored one at a time (default 1000)")
    parser.add_argument("--check-all", action="store_true", help="re-score every pair one at a time")
    parser.add_argument("--json", type=Path, help="also write the timings here")
    args = parser.parse_args(argv)
    if not args.data.is_file():
        parser.error(f"{args.data} not found; point --data at CRUD-RAG's crud_event_summary.jsonl")

    records = [json.loads(line) for line in args.data.read_text(encoding="utf-8").splitlines() if line.strip()]
    preds, refs = build_pairs(records, args.n)
    workers = args.workers or cpu_cores()
    config = resolve_config(args.profile)

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {os.cpu_count()} CPUs, load average {load:.2f} before the run")
    t0 = time.perf_counter()
    prepare(config)
    setup = time.perf_counter() - t0
    print(f"setup: jieba + WordNet loaded in {setup:.1f} s")

    t0, cpu0 = time.perf_counter(), os.times()
    report = score_pairs(preds, refs, args.profile, workers=workers)
    parallel, cpu1 = time.perf_counter() - t0, os.times()
    # CPU seconds of this process and its (joined) workers: comparable across runs on a busy machine.
    cpu = (cpu1.user + cpu1.system + cpu1.children_user + cpu1.children_system
           - cpu0.user - cpu0.system - cpu0.children_user - cpu0.children_system)
    means = "  ".join(f"{name} {m.value:.4f}" for name, m in report.metrics.items())
    print(f"parallel: {args.n} pairs, {workers} workers, {parallel:.1f} s wall, {cpu:.1f} s CPU "
          f"({args.n / parallel:.0f} pairs/s)  {means}")

    slice_n = args.n if args.check_all else min(args.serial_slice, args.n)
    picked = [round(k * args.n / slice_n) for k in range(slice_n)]
    t0 = time.perf_counter()
    serial = [score_example(preds[i], refs[i], config) for i in picked]
    serial_s = time.perf_counter() - t0
    same = serial == [report.examples[i] for i in picked]
    rate_serial, rate_parallel = slice_n / serial_s, args.n / parallel
    print(f"serial: {slice_n} evenly spaced pairs one at a time, {serial_s:.1f} s ({rate_serial:.0f} pairs/s); "
          f"identical to parallel: {same}; parallel/serial throughput ratio {rate_parallel / rate_serial:.2f}x")
    total = setup + parallel
    print(f"bench_metrics: {args.n} pairs scored with 4 metrics in {total:.1f} s including setup "
          f"(target < 60 s): {'PASS' if total < 60 and same else 'FAIL'}")
    if args.json:
        args.json.write_text(json.dumps({
            "n": args.n, "workers": workers, "load_avg": load, "setup_s": setup, "score_s": parallel, "cpu_s": cpu,
            "serial_slice": slice_n,
            "serial_s": serial_s, "identical": same, "means": {k: m.value for k, m in report.metrics.items()},
            "signatures": report.signatures(),
        }, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
