"""Streaming corpora: peak memory of `memreader read --set limit=100` over a 1,000,000-document JSONL against the
same over a 1,000-document one.

    .venv/bin/python scripts/bench_streaming.py                    # 1,000 vs 1,000,000 documents (~0.5 GB file)
    .venv/bin/python scripts/bench_streaming.py --large 200000

Both corpora are generated (nothing downloaded): documents of 3-6 sentences of the bundled demo corpus, the same
first 100 in both files. Each read is its own `memreader read` process (the embedded SmolLM2 on transformers,
100 documents; unguided replies of 24 tokens kept flagged, as the memory the corpus reader costs is what is
measured, not the memories), and its peak resident memory (ru_maxrss of that child) is measured by a small wrapper
process, so the two numbers do not mix. Printed side by side: file sizes, peak RSS, wall time, and the ratio of
the peaks (target <= 1.2). A third line reads the large file's first 100 records through `memreader.core.corpus`
alone (no model), which isolates what the corpus reader itself holds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "memreader" / "demo_data" / "corpus.jsonl"
BIN = Path(sys.executable).parent
PEAK = ("import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, "
        "stderr=subprocess.DEVNULL).returncode; print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, rc)")


def write_corpus(path: Path, n: int, seed: int = 0) -> None:
    texts = [json.loads(line)["text"] for line in DEMO.read_text(encoding="utf-8").splitlines()]
    pool = [s.strip() + "." for t in texts for s in t.replace("\n", " ").split(".") if len(s.strip()) > 20]
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            text = " ".join(rng.choice(pool) for _ in range(rng.randint(3, 6)))
            fh.write(json.dumps({"id": f"doc-{i:07d}", "text": text}, ensure_ascii=False) + "\n")


def peak(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """(peak RSS in MB of ``cmd``, seconds, exit code)."""
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", PEAK, *cmd], env=env, capture_output=True, text=True, check=True)
    kb, rc = out.stdout.split()
    return int(kb) / 1024, time.perf_counter() - t, int(rc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", type=int, default=1_000)
    ap.add_argument("--large", type=int, default=1_000_000)
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="the reader's model (registry name or folder)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        env = {**os.environ, "MEMREADER_HOME": str(home), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        rows = []
        for n in (args.small, args.large):
            corpus = Path(tmp) / f"corpus-{n}.jsonl"
            write_corpus(corpus, n)
            cmd = [str(BIN / "memreader"), "read", "--set", f"input={corpus}", "--set", f"run=stream-{n}",
                   "--set", f"limit={args.limit}", "--set", f"model={args.model}", "--set", "backend=transformers", "--set", "guided=off",
                   "--set", "max_new_tokens=24", "--set", "on_truncated=keep_flagged", "--set", "batch_size=32"]
            mb, seconds, rc = peak(cmd, env)
            if rc:
                print(f"memreader read failed on {corpus} (exit {rc}); rerun the command to see why: {' '.join(cmd)}")
                return 1
            read = json.loads((home / "runs" / f"stream-{n}" / "read" / "summary.json").read_text())["read"]
            rows.append((n, corpus.stat().st_size / 2**20, mb, seconds, read))
        probe = (f"from memreader.core.corpus import iter_corpus; import itertools; "
                 f"list(itertools.islice(iter_corpus({str(Path(tmp) / f'corpus-{args.large}.jsonl')!r}), {args.limit}))")
        corpus_only, _, _ = peak([sys.executable, "-c", probe], env)
    print(f"memreader read --set limit={args.limit} ({args.model}, transformers, 24-token replies, batch 32), one "
          "process each:")
    for n, size, mb, seconds, read in rows:
        print(f"  {n:>9,} documents  {size:8.1f} MB file  peak RSS {mb:7.1f} MB  {seconds:6.1f} s  ({read} read)")
    ratio = rows[1][2] / rows[0][2]
    print(f"peak RSS ratio large / small = {ratio:.3f} (target <= 1.2)")
    print(f"the corpus reader alone, first {args.limit} of {args.large:,}: peak RSS {corpus_only:.1f} MB")
    return 0 if ratio <= 1.2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
