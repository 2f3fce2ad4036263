"""Reading time with the cut head against without it: the same documents, the same engine, one process.

    python scripts/bench_cut_read.py --input artifacts/datasets/structure/test.jsonl --limit 40 \\
        --adapter results/structure-adapter [--set dtype=float32]

Reads the first ``--limit`` documents with ``memreader read`` without the head (``cut_head=none``) and with the
adapter's head (``cut_head=auto``, or ``--cut-head FOLDER``; several ``--cut-head NAME=FOLDER`` compare heads, e.g.
features of fewer layers), ``--repeats`` times each in alternating order (none, head, head, none, ...; with several
heads each round reverses the last), every read in a fresh process and run folder: an engine kept across reads would
serve the later reads' prompts from its prefix cache (measured: the fourth read of the same 40 documents 18 % faster
than the first), which no user reading a corpus once gets. Prints the reading loop's seconds (the run's
``summary.json`` less its engine's start-up; the figure compared), the whole command's, the ratios, and the head's own
seconds (its prefill + scoring, summed over documents). ``--set`` passes any other read key (``dtype=float32`` forces
the fp32 path a CPU without bf16 units takes; ``cut_ahead=0`` scores each document in turn).
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
    ap.add_argument("--cut-head", action="append", default=[],
                    help="a head to read with, FOLDER or NAME=FOLDER (repeat to compare heads; default: auto, the "
                         "adapter's cut_head/)")
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
    heads = [h.split("=", 1) if "=" in h else ["with head" if len(args.cut_head) <= 1 else h, h]
             for h in args.cut_head or ["auto"]]
    sides = [("without head", "none"), *((label, folder) for label, folder in heads)]
    order = [side for r in range(max(1, args.repeats)) for side in (sides if r % 2 == 0 else sides[::-1])]
    runs: dict[str, list[dict]] = {label: [] for label, _ in sides}
    for label, head in order:
        k = sides.index((label, head))
        run = "bench-cut-read-none" if k == 0 else f"bench-cut-read-head{k if len(heads) > 1 else ''}"
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
    call = {label: min(r["call_seconds"] for r in rs) for label, rs in runs.items()}
    ratios = {label: {"read_loop": round(best[label] / best["without head"], 3),
                      "call": round(call[label] / call["without head"], 3)} for label, _ in heads}
    first = heads[0][0]
    report = {"input": args.input, "limit": args.limit, "repeats": args.repeats, "cpu": cpu_label(),
              "settings": extra, "heads": dict(heads), "runs": runs, "ratios": ratios,
              "ratio_read_loop": ratios[first]["read_loop"], "ratio_call": ratios[first]["call"]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2), encoding="utf-8")
    for label, rs in runs.items():
        for r in rs:
            print(f"{label}: {r['documents']} documents, read loop {r['read_seconds']} s, call {r['call_seconds']} s "
                  f"({r['chunks_per_doc']} chunks/doc; head {r['cut_seconds']} s; {r['engine']})")
    for label, ratio in ratios.items():
        print(f"{label} / without (best of {args.repeats}): read loop x{ratio['read_loop']:.2f}, whole call "
              f"x{ratio['call']:.2f} on {report['cpu']}")
    print(f"→ {args.out}")


if __name__ == "__main__":
    main()
