"""How long one decoding step of a Qwen2.5 reader takes on a GPU, by batch size: the yardstick for the grammar
mask's CPU time per row per step (docs/BENCHMARKS.md, "Decoding step on a GPU").

    python3 scripts/gpu_decode_step.py --shape 7b --batches 1 8 24 64 --prompt-len 512 --steps 48
    python3 scripts/gpu_decode_step.py --smoke          # CPU plumbing check: 2 tiny layers, 3 steps

A guided read asks llguidance for one token mask per row per step, on the CPU. Whether that matters depends on
what a step costs on the accelerator: this builds the model from its config values (random weights, bf16, no
hub), prefills ``--prompt-len`` random tokens per row (a reader's prompt: instructions + a ~1,400-character
document is about 500 tokens), then times ``--steps`` single-token steps with the KV cache (transformers, eager,
``sdpa``), each between two ``cuda.synchronize()``. Beside the eager step it prints the memory-bound floor of a
step: (weights + the rows' KV cache) / the card's measured copy bandwidth, what a CUDA-graph engine (vLLM) can
approach. Output: one JSON line per batch size and a ``SUMMARY`` line; ``--out`` writes them all.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from _common import SHAPES, SMOKE, versions  # the same Qwen2.5 config values as the training MFU check


def copy_bandwidth(device: str, gib: float = 2.0, reps: int = 10) -> float:
    """Device-memory bandwidth in bytes/s from a large copy (read + write counted)."""
    n = int(gib * 2**30) // 2
    a = torch.empty(n, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        b.copy_(a)
    if device == "cuda":
        torch.cuda.synchronize()
    return 2 * a.numel() * a.element_size() * reps / (time.perf_counter() - t)


def build(shape: str, device: str, smoke: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    name, values = ("tiny", SMOKE) if smoke else SHAPES[shape]
    cfg = Qwen2Config(**values, attn_implementation="sdpa")
    dtype = torch.float32 if smoke else torch.bfloat16
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(dtype).eval()
    return name, cfg, model


@torch.no_grad()
def time_steps(model, cfg, batch: int, prompt_len: int, steps: int, device: str) -> list[float]:
    """Seconds of each single-token decoding step after a prefill of ``prompt_len`` tokens per row."""
    from transformers import DynamicCache

    ids = torch.randint(0, cfg.vocab_size, (batch, prompt_len), device=device)
    cache = DynamicCache()
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    times = []
    for _ in range(steps):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="7b")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 24, 64])
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=48, help="timed steps per batch size (after 4 untimed)")
    p.add_argument("--smoke", action="store_true", help="CPU, 2 tiny layers, 3 steps: checks the plumbing only")
    p.add_argument("--out", help="write the JSON lines here too")
    args = p.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    if args.smoke:
        args.batches, args.steps, args.prompt_len = [1, 2], 3, 16
    elif not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU machine, or --smoke for the CPU plumbing check")
    name, cfg, model = build(args.shape, device, args.smoke)
    weight_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
    bandwidth = copy_bandwidth(device, gib=0.01 if args.smoke else 2.0)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * (4 if args.smoke else 2)
    lines = []
    for batch in args.batches:
        time_steps(model, cfg, batch, args.prompt_len, 4, device)  # warm-up: kernels, allocator
        times = time_steps(model, cfg, batch, args.prompt_len, args.steps, device)
        median = statistics.median(times)
        context = args.prompt_len + args.steps // 2
        floor = (weight_bytes + batch * context * kv_per_token) / bandwidth
        lines.append({"model": name, "batch": batch, "prompt_len": args.prompt_len, "steps": args.steps,
                      "step_ms_median": round(median * 1e3, 3), "step_ms_p90": round(sorted(times)[int(0.9 * len(times))] * 1e3, 3),
                      "ms_per_row": round(median * 1e3 / batch, 4), "tokens_per_s": round(batch / median, 1),
                      "memory_floor_ms": round(floor * 1e3, 3), "eager_over_floor": round(median / floor, 2)})
        print(json.dumps(lines[-1]), flush=True)
    summary = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "shape": name,
               "weights_gib": round(weight_bytes / 2**30, 2), "copy_bandwidth_gbs": round(bandwidth / 1e9, 1),
               "attention": "sdpa", "engine": "transformers eager, DynamicCache", **versions()}
    print("SUMMARY " + json.dumps(summary), flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            for line in [*lines, summary]:
                f.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
