"""Decoding throughput of the embedded SmolLM2 on CPU: batch size 1 vs wider batches, side by side.

    .venv/bin/python scripts/bench_generation.py --batch-sizes 1 4 8 --new-tokens 48

Why: on this class of machine, greedy decoding of a 135M model is bound by memory bandwidth (each
step streams every weight), so a batch of 8 costs little more per step than a batch of 1. The demo
and the reader size their batches from this measurement. Prints tokens/s per batch size and the
ratio to batch size 1; every run generates exactly ``new_tokens`` per sequence (min_new_tokens), and
every sequence of every batch is the same demo document's prompt, so only the batch width changes.
"""

from __future__ import annotations

import argparse
import time

import torch

from memreader.core.corpus import read_corpus
from memreader.core.language import detect_language
from memreader.core.prompts import render
from memreader.core.registry import SMOLLM2
from memreader.core.runtime import load_causal_lm, runtime
from memreader.demo import DEMO_DATA


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = all cores)")
    parser.add_argument("--doc", type=int, default=0, help="index of the demo document used as the prompt")
    parser.add_argument("--model", default=SMOLLM2, help="registry name or model folder")
    args = parser.parse_args()
    rt = runtime("cpu", "float32", args.threads)
    model, tok = load_causal_lm(args.model, rt=rt)
    docs = read_corpus(DEMO_DATA / "corpus.jsonl")
    prompts = [tok.apply_chat_template(render("memreader", detect_language(d.text), document=d.text)[0],
                                       add_generation_prompt=True, tokenize=False) for d in docs]
    tok.padding_side = "left"
    rows = []
    for bs in args.batch_sizes:
        batch = [prompts[args.doc]] * bs
        enc = tok(batch, return_tensors="pt", padding=True, add_special_tokens=False)
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.generate(**enc, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                           pad_token_id=tok.pad_token_id)
        dt = time.perf_counter() - t0
        rows.append((bs, enc["input_ids"].shape[1], dt, bs * args.new_tokens / dt))
    base = rows[0][3]
    print(f"{args.model} fp32, {rt.threads} threads, {args.new_tokens} new tokens per sequence, "
          f"prompt = demo document {docs[args.doc].doc_id}")
    print(f"{'batch':>5} {'prompt_len':>10} {'seconds':>8} {'tok/s':>8} {'x batch1':>8}")
    for bs, plen, dt, tps in rows:
        print(f"{bs:>5} {plen:>10} {dt:>8.1f} {tps:>8.1f} {tps / base:>8.2f}")


if __name__ == "__main__":
    main()
