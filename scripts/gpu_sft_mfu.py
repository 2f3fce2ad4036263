"""LoRA SFT throughput and MFU of a Qwen2.5-shaped model (1.5B, 3B or 7B) through TRL's SFTTrainer, on one GPU.

    python3 scripts/gpu_sft_mfu.py                       # the reference run (GPU; see scripts/gpu_check.sh)
    python3 scripts/gpu_sft_mfu.py --shape 7b --batch-size 1 --seq-len 8192 --gradient-checkpointing full \
        --lora-r 32 --lora-alpha 64                      # the 7B recipe's micro-batch
    python3 scripts/gpu_sft_mfu.py --no-compile-layers --batch-size 16 --gradient-checkpointing full
    .venv/bin/python scripts/gpu_sft_mfu.py --smoke      # tiny 2-layer model, 2 steps, on CPU

What it does, in one process:
1. measures the device's dense bf16 matmul rate (8192^3 torch.matmul, CUDA events, best of several
   repetitions): this is the "peak" every MFU figure below is divided by, so MFU is relative to what
   this card actually does today, not to a datasheet;
2. builds Qwen2.5-1.5B (or ``--shape 3b`` / ``7b``) from its config with random weights (no hub access
   needed), bf16, directly on the device, with the fastest attention available (flash_attention_2 if the
   package imports, else sdpa);
3. trains a LoRA adapter (r=16, alpha=32, dropout 0.05, q,k,v,o,gate,up,down) with trl.SFTTrainer on a
   pre-tokenized synthetic dataset of fixed-length random token ids (no padding: every token counts),
   times ``--steps`` optimizer steps after ``--warmup-steps`` untimed ones, and reports tokens/s.
   Defaults = the reference configuration: batch 8 x 2048 tokens, no gradient checkpointing, fp32 adapters
   (PEFT's default, as training/sft.py gets them), each decoder layer torch.compile'd (--compile-layers: fuses
   the RMSNorm/RoPE/SiLU/LoRA-dropout elementwise traffic; +70% tokens/s on an H100 over eager).

FLOP accounting (per trained token; N = parameters that take part in a matmul = the decoder layers'
projection weights + the LM-head weight, tied or not; the embedding lookup is not a matmul; s = sequence
length, L = layers, d = heads x head_dim):
  * 6N            : the usual full-fine-tuning convention (2N forward + 4N backward), no attention term.
  * 6N+attn       : the same plus the attention score/value matmuls, 12*L*d*s (PaLM appendix B
                    convention: non-causal, i.e. the masked half is counted too).
  * LoRA model    : 4N + 6*N_lora + 12*L*d*s. The frozen weights get no weight gradient, only the input
                    gradient (2N forward + 2N backward); the adapter matrices are trained in full (6*N_lora);
                    attention has no weights, so its backward is unchanged. This is the honest "model
                    FLOPs" figure for LoRA; the >=35% MFU target is checked against it.
  * hardware      : LoRA model FLOPs + what gradient checkpointing recomputes (one more forward of the
                    decoder layers: 2*N_layers + 2*N_lora + 4*L*d*s; the LM head is not recomputed; with
                    TRL's selective checkpointing the attention output is kept, so 4*L*d*s drops out).
                    Equal to LoRA model FLOPs when checkpointing is off. HFU = hardware FLOP/s / peak.
MFU_x = FLOPs_x/token * tokens/s / measured peak bf16 FLOP/s.

Prints one summary line last and writes JSON to --out, or to $OUT/gpu_sft_mfu.json when $OUT is set.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import SHAPES, SMOKE, versions  # scripts/_common.py: the Qwen2.5 config values

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def log(msg: str) -> None:
    print(msg, flush=True)


def measure_matmul_peak(device: str, n: int, reps: int, iters: int) -> dict:
    """Best-of-``reps`` dense bf16 (fp32 on CPU) matmul rate, each rep the mean of ``iters`` back-to-back products."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    c = torch.empty(n, n, device=device, dtype=dtype)
    for _ in range(3):
        torch.matmul(a, b, out=c)
    rates = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                torch.matmul(a, b, out=c)
            end.record()
            end.synchronize()
            sec = start.elapsed_time(end) / 1e3 / iters
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                torch.matmul(a, b, out=c)
            sec = (time.perf_counter() - t0) / iters
        rates.append(2 * n**3 / sec)
    assert torch.isfinite(c).all(), "matmul produced non-finite values"
    del a, b, c
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"n": n, "dtype": str(dtype).replace("torch.", ""), "reps": reps, "iters_per_rep": iters,
            "tflops_best": max(rates) / 1e12, "tflops_median": sorted(rates)[len(rates) // 2] / 1e12,
            "tflops_all": [round(r / 1e12, 1) for r in rates]}


def pick_attention(requested: str, device: str) -> str:
    if requested != "auto":
        return requested
    if device == "cuda":
        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except Exception:  # noqa: BLE001
            pass
    return "sdpa"


def build_tokenizer(vocab_size: int):
    """A word-level tokenizer built in memory: SFTTrainer needs a processing_class, the data is pre-tokenized."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    hf.model_max_length = 10**9
    return hf


def flop_counts(cfg: dict, seq_len: int, n_lora: int) -> dict:
    """Per-token FLOPs by each convention (see the module docstring)."""
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = h // heads
    d_attn = heads * head_dim
    d_kv = kv * head_dim
    per_layer = h * d_attn + 2 * h * d_kv + d_attn * h + 3 * h * inter  # q, k, v, o, gate, up, down weights
    n_layers = layers * per_layer
    n_head = cfg["vocab_size"] * h
    n = n_layers + n_head
    attn_fwd = 4 * layers * d_attn * seq_len  # QK^T and AV, non-causal count, per token
    return {
        "N_matmul": n,
        "N_decoder_layers": n_layers,
        "N_lm_head": n_head,
        "N_lora": n_lora,
        "attn_fwd_per_token": attn_fwd,
        "attn_train_per_token": 3 * attn_fwd,  # = 12*L*d*s
        "flops_per_token_6N": 6 * n,
        "flops_per_token_6N_attn": 6 * n + 3 * attn_fwd,
        "flops_per_token_lora": 4 * n + 6 * n_lora + 3 * attn_fwd,
        "gc_recompute_per_token": 2 * n_layers + 2 * n_lora + attn_fwd,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny 2-layer model, 2 steps, on CPU (a plumbing check)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="1.5b",
                   help="which Qwen2.5 size to build (random weights from its config; ignored with --smoke)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8, help="per-device batch size (sequences per step)")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--gradient-checkpointing", choices=["off", "full", "selective"], default="off",
                   help="off; full (HF per-layer checkpointing); selective (TRL's SAC: keeps matmul outputs)")
    p.add_argument("--torch-compile", action="store_true",
                   help="SFTConfig(torch_compile=True): compiles the whole model (TRL's Triton LM-head kernel included)")
    p.add_argument("--compile-layers", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile each decoder layer (after PEFT wrapping), leaving TRL's LM-head kernel eager "
                        "(default: on for the GPU run, off for --smoke)")
    p.add_argument("--adapter-dtype", choices=["fp32", "bf16"], default="fp32",
                   help="fp32: PEFT's default (adapter weights upcast, via SFTTrainer(peft_config=...)); bf16: "
                        "get_peft_model(..., autocast_adapter_dtype=False), adapters in the base model's dtype")
    p.add_argument("--attn", default="auto", help="auto | sdpa | flash_attention_2 | eager")
    p.add_argument("--steps", type=int, default=20, help="timed optimizer steps")
    p.add_argument("--warmup-steps", type=int, default=5,
                   help="untimed optimizer steps before timing (they include the compilation)")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument("--lora-dropout", type=float, default=0.05)
    p.add_argument("--matmul-n", type=int, default=8192)
    p.add_argument("--label", default="", help="free-form name of this configuration, copied into the JSON")
    p.add_argument("--out", default=None, help="JSON path (default: $OUT/gpu_sft_mfu.json when $OUT is set)")
    args = p.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    if args.smoke:
        device, cfg_values, shape_name = "cpu", SMOKE, "smoke"
        args.seq_len, args.batch_size, args.steps, args.warmup_steps = 64, 2, 2, 1
        args.matmul_n = 256
        torch.set_num_threads(1)  # a toy model: more threads only contend with whatever else runs
        if args.compile_layers is None:
            args.compile_layers = False
    else:
        if not torch.cuda.is_available():
            log("error: no CUDA device (use --smoke for the CPU plumbing check)")
            return 2
        device, (shape_name, cfg_values) = "cuda", SHAPES[args.shape]
        if args.compile_layers is None:
            args.compile_layers = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    vers = versions()
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu"
    log(f"device: {gpu}")
    log("versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()))

    # 1. the ceiling
    peak = measure_matmul_peak(device, args.matmul_n, reps=5 if device == "cuda" else 2,
                               iters=20 if device == "cuda" else 2)
    log(f"matmul {peak['n']}^3 {peak['dtype']}: best {peak['tflops_best']:.1f} TFLOP/s, "
        f"median {peak['tflops_median']:.1f} (all {peak['tflops_all']})")

    # 2. the model, random weights, built directly on the device
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, Qwen2Config, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    attn = pick_attention(args.attn, device)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    config = Qwen2Config(**cfg_values)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    model.config.use_cache = False
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {shape_name}-shaped{' (SMOKE: Qwen2.5-1.5B layout, toy size)' if args.smoke else ''}, "
        f"{n_params / 1e9:.4f}B params, "
        f"{model.dtype}, attn_implementation={model.config._attn_implementation}, "  # third-party private
        f"built in {time.perf_counter() - t0:.1f}s")

    # 3. data: fixed-length random token ids, labels = input_ids, no padding anywhere
    total_steps = args.warmup_steps + args.steps
    n_rows = total_steps * args.batch_size * args.grad_accum
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, cfg_values["vocab_size"], (n_rows, args.seq_len), generator=gen).tolist()
    dataset = Dataset.from_dict({"input_ids": ids, "labels": ids})

    peft_config = LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
                             target_modules=LORA_TARGETS, task_type="CAUSAL_LM", bias="none")
    gc = args.gradient_checkpointing
    outdir = tempfile.mkdtemp(prefix="gpu_sft_mfu_")
    sft_kwargs = dict(
        output_dir=outdir,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        max_steps=total_steps,
        learning_rate=2e-4,
        lr_scheduler_type="constant",
        warmup_steps=0,
        bf16=device == "cuda",
        fp16=False,
        use_cpu=device == "cpu",
        gradient_checkpointing=gc != "off",
        gradient_checkpointing_kwargs={"use_reentrant": False, **({"selective": True} if gc == "selective" else {})}
        if gc != "off" else None,
        torch_compile=args.torch_compile,
        optim="adamw_torch_fused" if device == "cuda" else "adamw_torch",
        max_length=args.seq_len,
        packing=False,
        dataset_kwargs={"skip_prepare_dataset": True},
        logging_steps=10**6,
        save_strategy="no",
        report_to="none",
        dataloader_num_workers=0,
        dataloader_pin_memory=device == "cuda",
        seed=0,
        disable_tqdm=True,
    )
    sft_args = SFTConfig(**sft_kwargs)

    class StepTimer(TrainerCallback):
        """Synchronizes and stamps the clock at the end of the last warmup step and of the last timed step."""

        def __init__(self) -> None:
            self.t_start = self.t_end = None
            self.step_wall: list[float] = []
            self._last = None

        def on_step_end(self, args_, state, control, **kwargs):
            now = time.perf_counter()
            if self._last is not None:
                self.step_wall.append(now - self._last)
            self._last = now
            if state.global_step == args.warmup_steps:
                if device == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                self.t_start = self._last = time.perf_counter()
                self.step_wall.clear()
            elif state.global_step == total_steps:
                if device == "cuda":
                    torch.cuda.synchronize()
                self.t_end = time.perf_counter()
            return control

    timer = StepTimer()
    t0 = time.perf_counter()
    if args.adapter_dtype == "bf16":
        from peft import get_peft_model

        model = get_peft_model(model, peft_config, autocast_adapter_dtype=False)
        peft_config = None
    trainer = SFTTrainer(model=model, args=sft_args, train_dataset=dataset, peft_config=peft_config,
                         processing_class=build_tokenizer(cfg_values["vocab_size"]), callbacks=[timer])
    if args.compile_layers:
        # identical layers share one compiled graph; the limit only matters if they do not
        dynamo_config = torch._dynamo.config
        dynamo_config.cache_size_limit = max(dynamo_config.cache_size_limit, 64)
        base = trainer.model.get_base_model() if hasattr(trainer.model, "get_base_model") else trainer.model
        # layer 0's input (the frozen embedding output) needs no grad, the others' do: skipping layer 0 saves
        # compiling a second variant of the graph
        for layer in base.model.layers[1:]:
            layer.compile(dynamic=False)
    n_lora = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    lora_dtypes = sorted({str(p.dtype).replace("torch.", "") for p in trainer.model.parameters() if p.requires_grad})
    log(f"trainer ready in {time.perf_counter() - t0:.1f}s; trainable (LoRA) params {n_lora / 1e6:.2f}M "
        f"({'/'.join(lora_dtypes)}); steps {args.warmup_steps} warmup + {args.steps} timed; "
        f"batch {args.batch_size}x{args.seq_len} tokens x accum {args.grad_accum}; gc={gc}; "
        f"compile={args.torch_compile}; compile_layers={args.compile_layers}; adapters {args.adapter_dtype}")
    t0 = time.perf_counter()
    result = trainer.train()
    train_wall = time.perf_counter() - t0
    assert timer.t_start is not None and timer.t_end is not None, "step timer did not fire"
    timed = timer.t_end - timer.t_start
    loss = result.training_loss
    if not math.isfinite(loss):
        log(f"error: non-finite training loss {loss}")
        return 1

    tokens = args.steps * args.batch_size * args.grad_accum * args.seq_len  # fixed length: no padding tokens
    tps = tokens / timed
    fl = flop_counts(cfg_values, args.seq_len, n_lora)
    peak_flops = peak["tflops_best"] * 1e12
    hw_per_token = fl["flops_per_token_lora"]
    if gc == "full":
        hw_per_token += fl["gc_recompute_per_token"]
    elif gc == "selective":  # TRL's SAC saves the attention op's output: everything else is recomputed
        hw_per_token += fl["gc_recompute_per_token"] - fl["attn_fwd_per_token"]

    def mfu(per_token: float) -> float:
        return per_token * tps / peak_flops

    mem = {}
    if device == "cuda":
        mem = {"peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
               "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
               "total_gib": torch.cuda.get_device_properties(0).total_memory / 2**30}
    steps_sorted = sorted(timer.step_wall)
    report = {
        "label": args.label,
        "smoke": args.smoke,
        "device": gpu,
        "versions": vers,
        "matmul_peak": peak,
        "model": {"shape": shape_name, "config": cfg_values,
                  "params_total": n_params, "dtype": str(model.dtype).replace("torch.", ""),
                  "attn_implementation": attn},
        "lora": {"r": args.lora_r, "alpha": args.lora_alpha, "dropout": args.lora_dropout,
                 "targets": LORA_TARGETS, "trainable_params": n_lora, "param_dtypes": lora_dtypes},
        "settings": {"seq_len": args.seq_len, "batch_size": args.batch_size, "grad_accum": args.grad_accum,
                     "tokens_per_step": args.batch_size * args.grad_accum * args.seq_len,
                     "gradient_checkpointing": gc, "torch_compile": args.torch_compile,
                     "compile_layers": args.compile_layers, "adapter_dtype": args.adapter_dtype,
                     "warmup_steps": args.warmup_steps, "timed_steps": args.steps, "optim": sft_args.optim,
                     "bf16": sft_args.bf16},
        "timing": {"timed_seconds": timed, "train_wall_seconds": train_wall,
                   "step_seconds_median": steps_sorted[len(steps_sorted) // 2] if steps_sorted else None,
                   "step_seconds_min": steps_sorted[0] if steps_sorted else None,
                   "step_seconds_max": steps_sorted[-1] if steps_sorted else None,
                   "tokens_timed": tokens, "tokens_per_second": tps, "training_loss": loss},
        "flops": fl,
        "mfu": {"6N": mfu(fl["flops_per_token_6N"]), "6N_attn": mfu(fl["flops_per_token_6N_attn"]),
                "lora_4N_attn": mfu(fl["flops_per_token_lora"]), "hfu": mfu(hw_per_token)},
        "achieved_tflops": {"6N": fl["flops_per_token_6N"] * tps / 1e12,
                            "6N_attn": fl["flops_per_token_6N_attn"] * tps / 1e12,
                            "lora_4N_attn": fl["flops_per_token_lora"] * tps / 1e12,
                            "hardware": hw_per_token * tps / 1e12},
        "memory": mem,
        "argv": sys.argv[1:],
    }
    out = args.out or (os.path.join(os.environ["OUT"], "gpu_sft_mfu.json") if os.environ.get("OUT") else None)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=2) + "\n")
        log(f"wrote {out}")
    with contextlib.suppress(Exception):
        import shutil

        shutil.rmtree(outdir)
    m = report["mfu"]
    memtxt = f"{mem['peak_allocated_gib']:.1f}/{mem['total_gib']:.0f} GiB" if mem else "n/a"
    log(f"SUMMARY{' [SMOKE]' if args.smoke else ''} {args.label or 'run'}: {shape_name} on {gpu} | "
        f"peak {peak['dtype']} {peak['tflops_best']:.1f} TFLOP/s | {attn} bs={args.batch_size}x{args.seq_len} gc={gc} "
        f"compile={args.torch_compile}{' compile_layers' if args.compile_layers else ''} "
        f"adapters={args.adapter_dtype} | {tps:,.0f} tok/s | MFU 6N {m['6N']:.1%}, 6N+attn {m['6N_attn']:.1%}, "
        f"LoRA 4N+attn {m['lora_4N_attn']:.1%}, HFU {m['hfu']:.1%} | peak mem {memtxt} | loss {loss:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
