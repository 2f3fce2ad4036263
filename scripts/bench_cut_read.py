"""Reading time with the cut head against without it: the same documents, the same engine, one process.

    python scripts/bench_cut_read.py --input artifacts/datasets/structure/test.jsonl --limit 40 \\
        --adapter results/structure-adapter [--set dtype=float32]

Reads the first ``--limit`` documents with ``memreader read`` without the head (``cut_head=none``) and with the
adapter's head (``cut_head=auto``, or ``--cut-head FOLDER``), ``--repeats`` times each in alternating order (none,
head, head, none, ...), every read in a fresh process and run folder: an engine kept across reads would serve the
later reads' prompts from its prefix cache (measured: the fourth read of the same 40 documents 18 % faster than the
first), which no user reading a corpus once gets. Prints the reading loop's seconds (the run's ``summary.json``
less its engine's start-up; the figure compared), the whole command's, the ratios, and the head's own seconds (its
prefill + scoring, summed over documents). ``--set`` passes any other read key (``dtype=float32`` forces the fp32
path a CPU without bf16 units takes; ``cut_ahead=0`` scores each document in turn).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _common import cpu_label

from memreader.core.paths import run_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", required=True)
    ap.add_argument("--adapter", default="results/structure-adapter", help="LoRA adapter ('' = the base model)")
    ap.add_argument("--cut-head", default="auto", help="the head to read with (auto: the adapter's cut_head/)")
    ap.add_argument("--home", default="", help="MEMREADER_HOME for the two runs (default: the environment's)")
    ap.add_argument("--config", default="configs/inference/smollm2_cpu.yaml")
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2, help="reads of each side, in alternating order")
    ap.add_argument("--set", action="append", default=[], help="more read keys, key=value")
    ap.add_argument("--out", default="artifacts/bench/cut_read.json")
    args = ap.parse_args()
    extra = dict(kv.split("=", 1) for kv in args.set)  # recorded with the figures
    if args.home:
        os.environ["MEMREADER_HOME"] = args.home
    sides = (("without head", "none"), ("with head", args.cut_head))
    order = [sides[(i // 2 + i) % 2] for i in range(2 * max(1, args.repeats))]  # none, head, head, none, ...
    runs: dict[str, list[dict]] = {label: [] for label, _ in sides}
    for label, head in order:
        run = f"bench-cut-read-{'none' if head == 'none' else 'head'}"
        shutil.rmtree(run_dir(run, "read"), ignore_errors=True)
        cmd = [sys.executable, "-m", "memreader.cli", "read", "--config", args.config, "--set", f"input={args.input}",
               "--set", f"run={run}", "--set", f"adapter={args.adapter}", "--set", f"cut_head={head}",
               "--set", f"limit={args.limit}", *[a for kv in args.set for a in ("--set", kv)]]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"{label}: memreader read failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
        mems = [json.loads(line) for line in (run_dir(run, "read") / "memories.jsonl").read_text().splitlines()
                if line.strip()]
        summary = json.loads((run_dir(run, "read") / "summary.json").read_text())
        startup = summary["engine"].get("startup_s") or 0.0  # the run's seconds count the engine's start too
        runs[label].append({"call_seconds": round(seconds, 1), "read_seconds": round(summary["seconds"] - startup, 2),
                            "engine_startup_s": startup,
                            "documents": len(mems),
                            "chunks_per_doc": round(sum(len(m["scenarios"]) for m in mems) / max(1, len(mems)), 2),
                            "cut_seconds": (summary.get("cut_head") or {}).get("seconds"),
                            "engine": {k: summary["engine"].get(k) for k in ("backend", "dtype")}})
    best = {label: min(r["read_seconds"] for r in rs) for label, rs in runs.items()}
    ratio = best["with head"] / best["without head"]
    call_ratio = (min(r["call_seconds"] for r in runs["with head"])
                  / min(r["call_seconds"] for r in runs["without head"]))
    report = {"input": args.input, "limit": args.limit, "repeats": args.repeats, "cpu": cpu_label(),
              "settings": extra, "runs": runs, "ratio_read_loop": round(ratio, 3), "ratio_call": round(call_ratio, 3)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2), encoding="utf-8")
    for label, rs in runs.items():
        for r in rs:
            print(f"{label}: {r['documents']} documents, read loop {r['read_seconds']} s, call {r['call_seconds']} s "
                  f"({r['chunks_per_doc']} chunks/doc; head {r['cut_seconds']} s; {r['engine']})")
    print(f"with head / without (best of {args.repeats}): read loop x{ratio:.2f}, whole call x{call_ratio:.2f} on "
          f"{report['cpu']} → {args.out}")


if __name__ == "__main__":
    main()
