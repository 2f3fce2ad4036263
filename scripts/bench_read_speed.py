"""A guided read of the same documents, side by side: fixed groups (the reader before issue 35) against the stream
that keeps the engine full, at several batch sizes, on one engine.

    .venv/bin/python scripts/bench_read_speed.py                                   # vLLM, 24 docs, batch 8 24 64
    .venv/bin/python scripts/bench_read_speed.py --modes stream --batch-sizes 32 48 64 96 --docs 64
    .venv/bin/python scripts/bench_read_speed.py --backend transformers --batch-sizes 4 8 --docs 16

Every configuration reads the same ``--docs`` English documents (HotpotQA-100 passages joined to at least 1,400
characters, as ``profile_read_step.py`` composes them; or ``--corpus``) through the product's reader
(:func:`memreader.inference.reader.read_documents`, a fresh output folder each time, the reader's config
``--config`` with its guided decoding), one engine shared by all (started before the first timing; vLLM's prefix
cache emptied before each configuration, so none finds the prompts of the one before it cached). ``groups``: the
stream is held to fixed groups of ``batch`` documents, each drained to its last document before the next group goes
in, as the reader read until issue 35; ``stream``: the reader's own stream (vLLM: ``batch`` requests in the running
engine, topped up as each finishes).

Printed per configuration: seconds, documents/s, generated tokens/s, ``x rate`` (tokens/s x 2 x parameters over
this CPU's bf16 matmul rate, measured in the same run: ``n x n`` bf16 ``torch.mm``), whether every memory tiles
its document exactly and every one was guided, and the speed-up over the first configuration. A table goes to
``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from _common import compose_documents

from memreader.core.config import load_config
from memreader.core.corpus import Document
from memreader.core.hardware import matmul_rate
from memreader.core.schema import iter_memories
from memreader.inference.reader import ReadConfig, make_backend, read_documents, resolved


class Grouped:
    """A stream held to fixed groups: ``window`` requests go in, then nothing more until every one of them is out
    (the reader's behaviour until issue 35, for the side-by-side)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.window = inner, inner.window
        self._draining = False

    @property
    def pending(self) -> int:
        if self.inner.pending == 0:
            self._draining = False
        return max(self.inner.pending, self.window) if self._draining else self.inner.pending

    def submit(self, request: Any) -> None:
        self.inner.submit(request)
        self._draining = self._draining or self.inner.pending >= self.window

    def step(self) -> list[Any]:
        self._draining = True
        return self.inner.step()

    def close(self) -> None:
        self.inner.close()


def run_one(cfg: ReadConfig, docs: list[Document], backend: Any, mode: str) -> dict[str, Any]:
    import memreader.inference.reader as reader

    out_dir = Path(tempfile.mkdtemp(prefix=f"bench_read_{mode}_{cfg.batch_size}_"))
    opened = reader.open_stream
    if mode == "groups":
        reader.open_stream = lambda *a, **k: Grouped(opened(*a, **k))
    llm = getattr(backend, "llm", None)
    if llm is not None:  # vLLM: every configuration prefills its prompts itself, as a first read would
        llm.reset_prefix_cache()
    try:
        t0 = time.perf_counter()
        summary = read_documents(cfg, docs, out_dir, backend)
        seconds = time.perf_counter() - t0
    finally:
        reader.open_stream = opened
    memories = list(iter_memories(out_dir / "memories.jsonl"))
    texts = {d.doc_id: d.text for d in docs}
    tokens = sum(m.meta["generation"].get("completion_tokens") or 0 for m in memories)
    shutil.rmtree(out_dir)
    return {"mode": mode, "batch": cfg.batch_size, "seconds": round(seconds, 1), "read": summary["read"],
            "docs_per_s": round(summary["read"] / seconds, 3), "tok_per_s": round(tokens / seconds, 1),
            "generated_tokens": tokens, "tiles": all("".join(m.chunks) == texts[m.doc_id] for m in memories),
            "guided": summary["guided"], "failed": len(summary["failed"]), "asked_again": summary.get("asked_again")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/inference/smollm2_cpu.yaml")
    ap.add_argument("--backend", default="vllm", choices=["vllm", "transformers"])
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--model", default="", help="the reading model (default: the config's)")
    ap.add_argument("--modes", nargs="+", default=["groups", "stream"], choices=["groups", "stream"])
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[8, 24, 64])
    ap.add_argument("--docs", type=int, default=24)
    ap.add_argument("--corpus", default="", help="JSONL with a text field (default: HotpotQA-100 passages, composed)")
    ap.add_argument("--set", nargs="+", action="extend", default=[], help="more reader settings, key=value")
    ap.add_argument("--params", type=float, default=134.5e6, help="model parameters, for x rate")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    texts = compose_documents(args.docs, args.corpus)
    docs = [Document(f"d{i:03d}", t) for i, t in enumerate(texts)]
    base = resolved(load_config(ReadConfig, args.config, [f"backend={args.backend}", f"dtype={args.dtype}",
                                                         "input=-", "guided=on", *args.set]
                                + ([f"model={args.model}"] if args.model else [])))
    rate = matmul_rate("bfloat16", n=2048, seconds=3.0)
    print(f"bf16 matmul rate here: {rate:.0f} GFLOP/s (2048 x 2048, 3 s); {len(docs)} documents, "
          f"{sum(map(len, texts)) / len(texts):.0f} characters on average; backend {base.backend}, dtype {base.dtype}",
          flush=True)
    backend = make_backend(base)
    rows = []
    for batch in args.batch_sizes:
        for mode in args.modes:
            row = run_one(replace(base, batch_size=batch), docs, backend, mode)
            row["x_rate"] = round(row["tok_per_s"] * 2 * args.params / (rate * 1e9), 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    first = rows[0]
    print(f"\n| mode | batch | s | docs/s | tok/s | x rate | tiles | guided | vs {first['mode']} {first['batch']} |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['batch']} | {r['seconds']} | {r['docs_per_s']} | {r['tok_per_s']} | {r['x_rate']} | "
              f"{r['tiles']} | {r['guided']}/{r['read']} | {r['docs_per_s'] / first['docs_per_s']:.2f}x |")
    if args.out:
        Path(args.out).write_text(json.dumps({"rate_gflops": rate, "settings": vars(args), "rows": rows}, indent=1))
    if not all(r["tiles"] and r["guided"] == r["read"] == len(docs) for r in rows):
        sys.exit("some configuration did not read every document guided into an exactly tiling memory")


if __name__ == "__main__":
    main()
