"""The memreader method's reading of the MultiFieldQA-zh reference run, again, from the committed checkpoint's inputs:
the same 200 contexts, the same reader settings and adapter, today's reader; timed against the reference.

    .venv/bin/python scripts/bench_mfqa_read.py                     # all 200, as the eval's chunkers read today
    .venv/bin/python scripts/bench_mfqa_read.py --limit 48 --set batch_size=4 kv_cache_gib=1   # the reference's

The contexts and settings come from ``results/eval-multifieldqa-zh/`` (the checkpoint ``scripts/eval_checkpoint.py``
commits): the documents of the reads in the shared chunk cache (every memory holds its document) and that read's
``config.yaml`` (the reader's resolved settings: bf16 vLLM, guided, the demo adapter merged, chunk lengths for 284
characters), with ``adapter`` pointed at ``results/demo-adapter``, the engine settings the eval's chunkers use
today (``batch_size`` 32 requests in flight, ``kv_cache_gib`` 2: both outside the read key, so the memories' key is
the committed one) and ``--set`` overrides on top. The reference time is
that read's own ``summary.json`` (103 contexts in 2,473.6 s in the session that finished it: 24.0 s per context).

Printed: seconds, seconds per context and the ratio to the reference, windows, every memory tiling its context
exactly and guided, and how many memories equal the committed ones chunk for chunk (bf16 arithmetic depends on the
batch, so greedy replies may part where two tokens are nearly tied).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path

import yaml

from memreader.core.config import load_config
from memreader.core.schema import iter_memories
from memreader.eval.chunkers.base import ChunkerSettings
from memreader.inference.reader import ReadConfig, read_corpus_memories

ROOT = Path(__file__).resolve().parents[1]
READ = (ROOT / "results" / "eval-multifieldqa-zh" / "cache" / "multifieldqa_zh-2e4e7360f4d9" / "memreader"
        / "c284-16aa390bca00f4ba" / "read")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--read", default=str(READ), help="the committed read folder (memories.jsonl, config.yaml, "
                    "summary.json)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N contexts (0 = all)")
    ap.add_argument("--set", nargs="+", action="extend", default=[], help="reader settings on top, key=value")
    ap.add_argument("--out", default="", help="also write the result as JSON here")
    args = ap.parse_args()

    read = Path(args.read)
    committed = {m.doc_id: m for m in iter_memories(read / "memories.jsonl")}
    reference = json.loads((read / "summary.json").read_text())
    ref_per_context = reference["seconds"] / reference["read"]
    work = Path(tempfile.mkdtemp(prefix="bench_mfqa_read_"))
    corpus = work / "corpus.jsonl"
    docs = list(committed.values())[: args.limit or None]
    corpus.write_text("".join(json.dumps({"id": m.doc_id, "text": m.document}, ensure_ascii=False) + "\n"
                              for m in docs), encoding="utf-8")
    today = [f"batch_size={ChunkerSettings().batch_size}",  # how the eval's chunkers read today (not in the read key)
             f"kv_cache_gib={next(f.default for f in fields(ReadConfig) if f.name == 'kv_cache_gib')}"]
    cfg = load_config(ReadConfig, str(read / "config.yaml"),
                      [f"input={corpus}", f"adapter={ROOT / 'results' / 'demo-adapter'}", "run=bench-mfqa-read",
                       *today, *args.set])
    os.environ["MEMREADER_HOME"] = str(work / "home")
    print(f"{len(docs)} contexts, {sum(len(m.document) for m in docs) / len(docs):.0f} characters on average; "
          f"reference: {reference['read']} contexts in {reference['seconds']} s ({ref_per_context:.1f} s each), "
          f"batch_size {yaml.safe_load((read / 'config.yaml').read_text())['batch_size']}", flush=True)
    t0 = time.perf_counter()
    summary = read_corpus_memories(cfg)
    seconds = time.perf_counter() - t0
    mems = list(iter_memories(summary["memories"]))
    tiles = all("".join(m.chunks) == committed[m.doc_id].document for m in mems)
    same = sum(m.chunks == committed[m.doc_id].chunks for m in mems)
    per_context = seconds / max(1, summary["read"])
    row = {"contexts": len(docs), "read": summary["read"], "seconds": round(seconds, 1),
           "s_per_context": round(per_context, 2), "reference_s_per_context": round(ref_per_context, 2),
           "of_reference": round(per_context / ref_per_context, 3), "windows": summary["windows"],
           "guided": summary["guided"], "tiles": tiles, "same_chunks_as_committed": same,
           "memory_limit": summary.get("memory_limit"), "batch_size": cfg.batch_size, "kv_cache_gib": cfg.kv_cache_gib,
           "engine": summary["engine"]}
    print(json.dumps(row), flush=True)
    print(f"\n{summary['read']} contexts in {seconds:.0f} s: {per_context:.1f} s per context, "
          f"{per_context / ref_per_context:.2f} of the reference's {ref_per_context:.1f} s "
          f"(batch_size {cfg.batch_size}, kv_cache_gib {cfg.kv_cache_gib:g}); every memory tiles: {tiles}; "
          f"{same} of {len(mems)} equal the committed memories chunk for chunk")
    if args.out:
        Path(args.out).write_text(json.dumps(row, indent=1))
    shutil.rmtree(work)
    if not tiles or summary["guided"] != summary["read"] or summary["read"] != len(docs):
        sys.exit("not every context was read guided into an exactly tiling memory")


if __name__ == "__main__":
    main()
