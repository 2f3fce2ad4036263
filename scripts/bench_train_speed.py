"""CPU LoRA training speed: the settings a recipe can choose, side by side on the same records, one run each.

    python scripts/bench_train_speed.py --config configs/training/smollm2_135m_lora_structure_cpu.yaml \\
        --records 16 --val 8 [--setting NAME='k=v k=v' ...]

Every setting trains the recipe's model and LoRA through ``memreader train`` (a subprocess each, so threads and
memory start clean) on the same first ``--records`` training records, seen once in the same order, with the same
effective batch (``--batch`` records per optimizer step, gradient accumulation where a setting's micro-batch is
smaller), then evaluates the same ``--val`` dev records. It prints tokens/s (TRL's count of real tokens over the
training seconds), the speed against the first setting, and the dev loss after the same updates: a faster setting
that changes the dev loss changed the training, not only its speed. The default settings: fp32 batch 1 with
accumulation (the recipe's arithmetic), the same with TRL's own LM head (``completion_head=false``: every position
projected) and with LoRA dropout 0.05 (the recipe before 2026-12-07), fp32 padded batches, fp32 padding-free batches
(``padding_free``: one row per batch; transformers' SDPA keeps the records apart by their position ids) and bf16
autocast. The CPU's flags are printed with the figures: bf16 speed depends on them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import cpu_label

DEFAULT_SETTINGS = {
    "fp32, batch 1 x accumulation": "per_device_train_batch_size=1 gradient_accumulation_steps={batch} bf16=false",
    "the same, TRL's LM head": ("per_device_train_batch_size=1 gradient_accumulation_steps={batch} bf16=false "
                                "completion_head=false"),
    "the same, LoRA dropout 0.05": ("per_device_train_batch_size=1 gradient_accumulation_steps={batch} bf16=false "
                                    "lora_dropout=0.05"),
    "fp32, padded batch": "per_device_train_batch_size={batch} gradient_accumulation_steps=1 bf16=false",
    "fp32, padding-free batch": ("per_device_train_batch_size={batch} gradient_accumulation_steps=1 bf16=false "
                                 "padding_free=true"),
    "bf16 autocast, batch 1 x accumulation": ("per_device_train_batch_size=1 gradient_accumulation_steps={batch} "
                                              "bf16=true"),
}


def first_lines(src: Path, n: int, dst: Path) -> Path:
    with src.open(encoding="utf-8") as fh:
        lines = [line for line in fh if line.strip()][:n]
    if len(lines) < n:
        raise SystemExit(f"{src} has {len(lines)} records, fewer than the {n} asked for: lower --records / --val")
    dst.write_text("".join(lines), encoding="utf-8")
    return dst


def run_setting(name: str, keys: str, args: argparse.Namespace, home: Path, train: Path, val: Path) -> dict:
    env = dict(os.environ, MEMREADER_HOME=str(home))
    sets = []
    for kv in keys.format(batch=args.batch).split():
        key, value = kv.split("=", 1)
        if key.isupper():  # an environment variable (thread count)
            env[key] = value
        else:
            sets.append(kv)
    run = "speed-" + "".join(c if c.isalnum() else "-" for c in name.lower())
    steps = args.records // args.batch
    cmd = [sys.executable, "-m", "memreader.cli", "train", "--config", args.config, "--set", f"run={run}",
           "--set", f"train_file={train}", "--set", f"val_file={val}", "--set", f"max_steps={steps}",
           "--set", 'eval_strategy="no"', "--set", 'save_strategy="no"', "--set", "warmup_steps=0",
           "--set", "logging_steps=1", "--set", "overwrite=true", "--set", "dataloader_num_workers=0"]
    for kv in sets + args.set:
        cmd += ["--set", kv]
    print(f"[{name}] {' '.join(sets)}", flush=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"setting {name!r} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads((home / "runs" / run / "train" / "summary.json").read_text(encoding="utf-8"))
    return {"keys": " ".join(sets), "env": {k: env[k] for k in ("OMP_NUM_THREADS",) if k in env},
            "steps": summary["steps"], "tokens": summary["tokens"], "seconds": summary["seconds"],
            "tokens_per_second": summary["tokens_per_second"], "first_loss": summary["first_loss"],
            "last_loss": summary["last_loss"], "dev_loss": summary["last_eval_loss"], "bf16": summary["bf16"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/training/smollm2_135m_lora_structure_cpu.yaml")
    ap.add_argument("--train-file", default="", help="SFT records (default: the recipe's train_file)")
    ap.add_argument("--val-file", default="", help="dev SFT records (default: the recipe's val_file)")
    ap.add_argument("--records", type=int, default=16, help="training records each setting sees once")
    ap.add_argument("--val", type=int, default=8, help="dev records each setting is evaluated on")
    ap.add_argument("--batch", type=int, default=4, help="records per optimizer step, the same for every setting")
    ap.add_argument("--setting", action="append", default=[],
                    help="NAME='k=v k=v' (SFT keys; UPPER=v sets an environment variable); default: the five above")
    ap.add_argument("--only", action="append", default=[], help="run only these default settings (by name)")
    ap.add_argument("--set", action="append", default=[], help="a key for every setting (e.g. model=...)")
    ap.add_argument("--out", default="artifacts/bench/train_speed.json")
    args = ap.parse_args()
    if args.records % args.batch:
        raise SystemExit(f"--records {args.records} is not a multiple of --batch {args.batch}")
    import yaml

    recipe = yaml.safe_load(Path(args.config).read_text(encoding="utf-8"))
    settings = dict(kv.split("=", 1) for kv in args.setting) if args.setting else dict(DEFAULT_SETTINGS)
    if args.only:
        settings = {k: v for k, v in settings.items() if k in args.only}
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        tmp_path = Path(tmp)
        train = first_lines(Path(args.train_file or recipe["train_file"]), args.records, tmp_path / "train.jsonl")
        val = first_lines(Path(args.val_file or recipe["val_file"]), args.val, tmp_path / "val.jsonl")
        rows = {name: run_setting(name, keys, args, tmp_path / "home", train, val) for name, keys in settings.items()}
    base = next(iter(rows.values()))["tokens_per_second"] or 1.0
    report = {"config": args.config, "records": args.records, "val": args.val, "batch": args.batch,
              "cpu": cpu_label(), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(f"\n{args.records} records once, {args.batch} per step, dev loss on {args.val}; {report['cpu']}")
    print("| setting | tokens/s | vs first | seconds | loss first -> last | dev loss |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['tokens_per_second']} | {(r['tokens_per_second'] or 0) / base:.2f}x | {r['seconds']} | "
              f"{r['first_loss']:.4f} -> {r['last_loss']:.4f} | {r['dev_loss']:.4f} |")
    print(f"→ {args.out}")


if __name__ == "__main__":
    main()
