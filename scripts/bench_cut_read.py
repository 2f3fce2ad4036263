"""Reading time with the cut head against without it: the same documents, the same engine, one process.

    python scripts/bench_cut_read.py --input artifacts/datasets/structure/test.jsonl --limit 40 \\
        --adapter results/structure-adapter [--set dtype=float32]

Reads the first ``--limit`` documents twice through ``memreader read`` (:func:`memreader.api.read`), first with
``cut_head=none``, then with the adapter's head (``cut_head=auto``, or ``--cut-head FOLDER``), each into its own fresh
run folder, and prints
both wall times, the ratio and the head's own seconds (its prefill + scoring, summed over documents). ``--set`` passes
any other read key (``dtype=float32`` forces the fp32 path a CPU without bf16 units takes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import time
from pathlib import Path

from memreader import api
from memreader.core.paths import run_dir


def cpu_flags() -> str:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    flags = sorted({f for f in ("amx_bf16", "avx512_bf16", "avx512f") if f" {f}" in text})
    return f"{platform.processor() or platform.machine()} ({', '.join(flags) or 'no avx512/bf16 flags'})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", required=True)
    ap.add_argument("--adapter", default="results/structure-adapter", help="LoRA adapter ('' = the base model)")
    ap.add_argument("--cut-head", default="auto", help="the head to read with (auto: the adapter's cut_head/)")
    ap.add_argument("--home", default="", help="MEMREADER_HOME for the two runs (default: the environment's)")
    ap.add_argument("--config", default="configs/inference/smollm2_cpu.yaml")
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--set", action="append", default=[], help="more read keys, key=value")
    ap.add_argument("--out", default="artifacts/bench/cut_read.json")
    args = ap.parse_args()
    extra = dict(kv.split("=", 1) for kv in args.set)
    if args.home:
        os.environ["MEMREADER_HOME"] = args.home
    rows = {}
    for label, head in (("without head", "none"), ("with head", args.cut_head)):
        run = f"bench-cut-read-{'none' if head == 'none' else 'head'}"
        shutil.rmtree(run_dir(run, "read"), ignore_errors=True)
        t0 = time.perf_counter()
        mems = api.read(args.input, run=run, config=args.config, adapter=args.adapter, cut_head=head,
                        limit=args.limit, **extra)
        seconds = time.perf_counter() - t0
        summary = json.loads((run_dir(run, "read") / "summary.json").read_text())
        rows[label] = {"seconds": round(seconds, 1), "documents": len(mems),
                       "chunks_per_doc": round(sum(len(m.scenarios) for m in mems) / max(1, len(mems)), 2),
                       "cut_seconds": (summary.get("cut_head") or {}).get("seconds"),
                       "engine": {k: summary["engine"].get(k) for k in ("backend", "dtype")}}
    ratio = rows["with head"]["seconds"] / rows["without head"]["seconds"]
    report = {"input": args.input, "limit": args.limit, "cpu": cpu_flags(), "settings": extra, "rows": rows,
              "ratio": round(ratio, 3)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2), encoding="utf-8")
    for label, r in rows.items():
        print(f"{label}: {r['documents']} documents in {r['seconds']} s ({r['chunks_per_doc']} chunks/doc; head "
              f"{r['cut_seconds']} s; {r['engine']})")
    print(f"with head / without: x{ratio:.2f} on {report['cpu']} → {args.out}")


if __name__ == "__main__":
    main()
