"""LoRA SFT of MemReader with TRL + PEFT (+ accelerate / DeepSpeed): loss on the completion only.

Data: ``sft_train.jsonl`` / ``sft_val.jsonl`` from data_gen (``$MEMREADER_HOME/runs/<run>/gen/``) in
TRL's conversational prompt-completion format (see :mod:`training.preflight`). Outputs, all in
``$MEMREADER_HOME/runs/<run>/train/``: the LoRA adapter + tokenizer (``PeftModel.from_pretrained``),
``config.yaml`` (resolved config), ``trainer_args.json`` (the exact TRL ``SFTConfig``), ``preflight.json``
(token lengths), ``curves.jsonl`` (log history) and ``summary.json`` (losses, steps, speed, versions).

Commands (run from the repository root)::

    # CPU smoke run on the embedded SmolLM2-135M (a few steps, fp32)
    python -m training.sft --config configs/training/smollm2/135m_lora_cpu_smoke.yaml \\
        --set train_file=artifacts/runs/gen-smollm2/gen/sft_train.jsonl --set run=smoke
    # token-length statistics only (no training): writes <run>/train/preflight.json
    python -m training.sft --config configs/training/qwen2_5/7B_lora_single_gpu.yaml --set run=mr-7b \\
        --preflight-only
    # 1 GPU
    accelerate launch --config_file configs/accelerate/single_gpu.yaml \\
        -m training.sft --config configs/training/qwen2_5/1.5B_lora_single_gpu.yaml --set run=mr-1.5b
    # 8 GPUs, DeepSpeed ZeRO-3 (ZeRO-2 / plain DDP: multi_gpu_ds_zero2.yaml / multi_gpu_ddp.yaml);
    # lower gradient_accumulation_steps so the global batch stays that of the 1-GPU recipe
    accelerate launch --config_file configs/accelerate/multi_gpu_ds_zero3.yaml \\
        -m training.sft --config configs/training/qwen2_5/7B_lora_single_gpu.yaml --set run=mr-7b \\
        --set gradient_accumulation_steps=2
    # several nodes (run on every node; shared MEMREADER_HOME; see docs/TRAINING.md)
    accelerate launch --config_file configs/accelerate/multi_node_ds_zero3.yaml \\
        --machine_rank $NODE_RANK --main_process_ip $MASTER_ADDR --num_machines 2 --num_processes 16 \\
        -m training.sft --config configs/training/qwen2_5/7B_lora_single_gpu.yaml --set run=mr-7b-2n

The same flags work as ``memreader train --config ... --set key=value``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memreader.config import ConfigError, describe_config, field, load_config
from memreader.paths import run_dir, sha256_file, write_json, write_resolved_config
from memreader.registry import resolve_model
from training.preflight import (
    POLICIES,
    DataFormatError,
    PreflightError,
    check_lengths,
    format_report,
    load_sft_records,
    write_report,
)

log = logging.getLogger(__name__)


@dataclass
class SFTRunConfig:
    """Hyper-parameters of one LoRA SFT run (hardware lives in configs/accelerate and configs/deepspeed)."""

    train_file: str = field(help="SFT train JSONL (TRL conversational prompt-completion, from data_gen)")
    val_file: str | None = field(None, help="optional validation JSONL in the same format; its loss is logged")
    model: str = field("smollm2-135m-instruct", help="base model: registry name, local folder or hub id "
                       "(e.g. Qwen/Qwen2.5-7B-Instruct)")
    run: str | None = field(None, help="run name; outputs go to $MEMREADER_HOME/runs/<run>/train "
                            "(default: a timestamp; required when launched on several processes)")
    overwrite: bool = field(False, help="allow training into a run folder that already holds an adapter")
    lora_r: int = field(16, ge=1, help="LoRA rank")
    lora_alpha: int = field(32, gt=0, help="LoRA alpha (scaling = alpha / r)")
    lora_dropout: float = field(0.05, ge=0, lt=1, help="dropout on the LoRA branch")
    lora_target_modules: str = field("all-linear", help="'all-linear' (every linear layer but lm_head) or "
                                     "comma-separated module names, e.g. 'q_proj,v_proj'")
    learning_rate: float = field(2e-4, gt=0, help="peak learning rate (AdamW)")
    lr_scheduler_type: str = field("cosine", help="transformers scheduler name: cosine, linear, constant, ...")
    warmup_steps: float = field(0.03, ge=0, help="warm-up: a step count, or a fraction of all steps if < 1")
    weight_decay: float = field(0.0, ge=0, help="AdamW weight decay")
    num_train_epochs: float = field(3.0, gt=0, help="epochs over the train set (ignored when max_steps > 0)")
    max_steps: int = field(-1, ge=-1, help="optimizer steps to run; > 0 overrides num_train_epochs")
    per_device_train_batch_size: int = field(1, ge=1, help="micro-batch size per process")
    per_device_eval_batch_size: int = field(1, ge=1, help="eval micro-batch size per process")
    gradient_accumulation_steps: int = field(8, ge=1, help="micro-batches per optimizer step "
                                             "(global batch = this x micro-batch x processes)")
    max_length: int = field(4096, ge=1, help="max tokens of prompt + completion; longer examples are refused or "
                            "dropped (truncation_policy), never silently truncated")
    truncation_policy: str = field("refuse", help="'refuse': stop if any example exceeds max_length; "
                                   "'drop': drop those examples with a loud warning")
    bf16: str = field("auto", help="bf16 weights + autocast: auto (on when the GPU supports it), true, false")
    attn_implementation: str | None = field(None, help="attention kernel: sdpa, flash_attention_2, eager "
                                            "(default: transformers' choice)")
    gradient_checkpointing: bool = field(True, help="recompute activations in backward (less memory, ~20% slower)")
    logging_steps: int = field(10, ge=1, help="log loss / lr / tokens every N steps (step 1 is always logged)")
    eval_steps: int = field(0, ge=0, help="evaluate on val_file every N steps; 0 = once at the end")
    save_steps: int = field(500, ge=0, help="write a resumable checkpoint every N steps; 0 = no checkpoints")
    save_total_limit: int = field(2, ge=1, help="keep at most this many checkpoints")
    seed: int = field(42, ge=0, help="random seed (LoRA init, data order)")
    deepspeed: str | None = field(None, help="DeepSpeed JSON (configs/deepspeed/zero2.json) for torchrun "
                                  "launches; with accelerate launch, the accelerate profile names it instead")
    report_to: str = field("none", help="experiment trackers: none, tensorboard, wandb, ...")
    resume: bool = field(False, help="resume from the last checkpoint in the run folder")
    merge: bool = field(False, help="also save base + adapter merged into <run>/train/merged (single process)")

    def check(self) -> list[str]:
        """Every problem with the values, for :func:`memreader.config.load_config`."""
        problems = []
        if self.truncation_policy not in POLICIES:
            problems.append(f"truncation_policy={self.truncation_policy!r}: use one of {', '.join(POLICIES)}")
        if str(self.bf16).lower() not in ("auto", "true", "false"):
            problems.append(f"bf16={self.bf16!r}: use auto, true or false")
        for name in ("lora_r", "lora_alpha", "max_length", "per_device_train_batch_size",
                     "per_device_eval_batch_size", "gradient_accumulation_steps", "logging_steps"):
            if getattr(self, name) <= 0:
                problems.append(f"{name}={getattr(self, name)!r}: must be > 0")
        if not 0.0 <= self.lora_dropout < 1.0:
            problems.append(f"lora_dropout={self.lora_dropout!r}: must be in [0, 1)")
        if self.learning_rate <= 0:
            problems.append(f"learning_rate={self.learning_rate!r}: must be > 0")
        if self.max_steps <= 0 and self.num_train_epochs <= 0:
            problems.append("set max_steps > 0 or num_train_epochs > 0")
        for name in ("train_file", "val_file", "deepspeed"):
            value = getattr(self, name)
            if value and not Path(value).is_file():
                problems.append(f"{name}={value!r}: file not found (paths are relative to the working directory)")
        return problems


CONFIG_CLASS = SFTRunConfig  # lets `memreader train --help` list every key


def bf16_enabled(value: str) -> bool:
    """Resolve the ``bf16`` setting: ``auto`` is on only for a CUDA device that supports bf16."""
    value = str(value).lower()
    if value == "auto":
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    return value == "true"


def load_tokenizer(model_path: str) -> Any:
    """The base model's tokenizer, with a pad token (the EOS token when the model defines none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def records_to_dataset(records: list[dict[str, Any]]) -> Any:
    """A ``datasets.Dataset`` with only ``prompt`` / ``completion`` (messages reduced to role + content)."""
    from datasets import Dataset

    def slim(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
        return [{"role": m["role"], "content": m["content"]} for m in messages]

    return Dataset.from_list([{"prompt": slim(r["prompt"]), "completion": slim(r["completion"])} for r in records])


def build_sft_config(cfg: SFTRunConfig, output_dir: Path, has_eval: bool) -> Any:
    """TRL ``SFTConfig`` for this run (creating it also sets up the distributed state)."""
    import torch
    from trl import SFTConfig

    bf16 = bf16_enabled(cfg.bf16)
    init_kwargs: dict[str, Any] = {"dtype": torch.bfloat16 if bf16 else torch.float32}
    if cfg.attn_implementation:
        init_kwargs["attn_implementation"] = cfg.attn_implementation
    # transformers >= 5.x renamed gradient_checkpointing (the old name still works, with a FutureWarning)
    checkpointing = ("activation_checkpointing" if "activation_checkpointing" in SFTConfig.__dataclass_fields__
                     else "gradient_checkpointing")
    return SFTConfig(
        output_dir=str(output_dir),
        run_name=output_dir.parent.name,
        model_init_kwargs=init_kwargs,
        max_length=cfg.max_length,
        completion_only_loss=True,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type=cfg.lr_scheduler_type,
        warmup_steps=cfg.warmup_steps,
        weight_decay=cfg.weight_decay,
        num_train_epochs=cfg.num_train_epochs,
        max_steps=cfg.max_steps,
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        per_device_eval_batch_size=cfg.per_device_eval_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        bf16=bf16,
        **{checkpointing: cfg.gradient_checkpointing},
        logging_steps=cfg.logging_steps,
        logging_first_step=True,
        eval_strategy="steps" if has_eval and cfg.eval_steps > 0 else "no",
        eval_steps=cfg.eval_steps if cfg.eval_steps > 0 else None,
        save_strategy="steps" if cfg.save_steps > 0 else "no",
        save_steps=max(cfg.save_steps, 1),
        save_total_limit=cfg.save_total_limit,
        seed=cfg.seed,
        deepspeed=cfg.deepspeed or None,
        report_to=cfg.report_to,
        use_cpu=not torch.cuda.is_available(),
    )


def build_trainer(
    cfg: SFTRunConfig, model_path: str, tokenizer: Any, args: Any,
    train_records: list[dict[str, Any]], val_records: list[dict[str, Any]] | None = None,
) -> Any:
    """An ``SFTTrainer`` whose model is ``model_path`` wrapped with a fresh LoRA adapter."""
    from peft import LoraConfig
    from trl import SFTTrainer

    targets = cfg.lora_target_modules.strip()
    lora = LoraConfig(
        r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout, bias="none", task_type="CAUSAL_LM",
        target_modules=targets if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()],
    )
    return SFTTrainer(
        model=model_path,  # a path: TRL loads it after ZeRO-3 setup
        args=args,
        train_dataset=records_to_dataset(train_records),
        eval_dataset=records_to_dataset(val_records) if val_records else None,
        processing_class=tokenizer,
        peft_config=lora,
    )


def _summarize(cfg: SFTRunConfig, trainer: Any, seconds: float, counts: dict[str, int]) -> dict[str, Any]:
    import peft
    import torch
    import transformers
    import trl

    history = trainer.state.log_history
    losses = [h["loss"] for h in history if "loss" in h]
    tokens = max((h.get("num_tokens", 0) for h in history), default=0)
    eval_losses = [h["eval_loss"] for h in history if "eval_loss" in h]
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    steps = trainer.state.global_step
    return {
        "model": cfg.model,
        "steps": steps,
        "epochs": round(float(trainer.state.epoch or 0.0), 4),
        "seconds": round(seconds, 2),
        "steps_per_second": round(steps / seconds, 4) if seconds else None,
        "tokens": int(tokens),
        "tokens_per_second": round(tokens / seconds, 1) if seconds else None,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "min_loss": min(losses) if losses else None,
        "last_eval_loss": eval_losses[-1] if eval_losses else None,
        "trainable_params": int(trainable),
        "world_size": trainer.args.world_size,
        "device": str(trainer.args.device),
        "bf16": bool(trainer.args.bf16),
        **counts,
        "data": {"train_file": cfg.train_file, "train_sha256": sha256_file(cfg.train_file),
                 "val_file": cfg.val_file, "val_sha256": sha256_file(cfg.val_file) if cfg.val_file else None},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "trl": trl.__version__, "peft": peft.__version__},
    }


def train(cfg: SFTRunConfig, preflight_only: bool = False) -> dict[str, Any]:
    """Pre-flight, LoRA SFT, and save everything into the run folder; returns the summary dict."""
    from transformers.trainer_utils import get_last_checkpoint

    problems = cfg.check()
    if cfg.run is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        problems.append("run is not set: every process must write to the same folder, so pass --set run=NAME")
    if problems:
        raise ConfigError("SFTRunConfig:\n  - " + "\n  - ".join(problems))
    out = run_dir(cfg.run, "train")
    if not preflight_only and not cfg.resume and not cfg.overwrite and (out / "adapter_config.json").exists():
        raise ConfigError(f"{out} already holds a trained adapter; pick another run name, or set "
                          "overwrite=true (start again) or resume=true (continue from the last checkpoint)")
    args = build_sft_config(cfg, out, has_eval=bool(cfg.val_file))
    with args.main_process_first(desc="resolve model"):  # converts the embedded model once per node
        model_path = resolve_model(cfg.model)
    tokenizer = load_tokenizer(model_path)

    train_records, train_report = check_lengths(
        load_sft_records(cfg.train_file), tokenizer, cfg.max_length, cfg.truncation_policy, "train")
    reports = {"train": train_report}
    val_records = None
    if cfg.val_file:
        val_records, reports["val"] = check_lengths(
            load_sft_records(cfg.val_file), tokenizer, cfg.max_length, cfg.truncation_policy, "val")
    if args.process_index == 0:
        write_report(out, reports, {"model": cfg.model, "tokenizer": model_path})
        write_resolved_config(out, cfg)
    for report in reports.values():
        log.info("pre-flight\n%s", format_report(report))
    counts = {f"{split}_examples": r["kept"] for split, r in reports.items()}
    counts.update({f"{split}_dropped": r["dropped"] for split, r in reports.items()})
    if preflight_only:
        return {"run_dir": str(out), "preflight": reports}

    resume_from = None
    if cfg.resume:
        resume_from = get_last_checkpoint(str(out))
        if resume_from is None:
            raise ConfigError(f"resume=true but {out} holds no checkpoint-* folder; train with save_steps > 0 first")
    trainer = build_trainer(cfg, model_path, tokenizer, args, train_records, val_records)
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume_from)
    seconds = time.perf_counter() - start
    if val_records and args.eval_strategy == "no":
        trainer.evaluate()
    trainer.save_model(str(out))  # adapter + tokenizer (gathers ZeRO-3 shards)
    summary = _summarize(cfg, trainer, seconds, counts)
    if trainer.is_world_process_zero():
        (out / "trainer_args.json").write_text(args.to_json_string(), encoding="utf-8")
        with (out / "curves.jsonl").open("w", encoding="utf-8") as handle:
            for entry in trainer.state.log_history:
                handle.write(json.dumps(entry) + "\n")
        write_json(out / "summary.json", summary)
        if cfg.merge:
            from training.merge import merge_adapter

            summary["merged_dir"] = str(merge_adapter(str(out), str(out / "merged"), base=cfg.model,
                                                         overwrite=cfg.overwrite))
        log.info("trained %d steps in %.1f s (%.3f steps/s, %.0f tokens/s), loss %.4f -> %.4f; adapter in %s",
                 summary["steps"], seconds, summary["steps_per_second"] or 0, summary["tokens_per_second"] or 0,
                 summary["first_loss"] or float("nan"), summary["last_loss"] or float("nan"), out)
    summary["run_dir"] = str(out)
    return summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m training.sft`` and ``memreader train``."""
    parser.add_argument("--config", help="training YAML, e.g. configs/training/qwen2_5/1.5B_lora_single_gpu.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config key (repeatable), e.g. --set max_steps=20")
    parser.add_argument("--preflight-only", action="store_true",
                        help="only measure token lengths and write preflight.json; do not train")
    parser.add_argument("--list-keys", action="store_true", help="print every config key with its help and exit")


def run(args: argparse.Namespace) -> int:
    """Run from parsed flags; returns a process exit code."""
    if args.list_keys:
        print(describe_config(SFTRunConfig))
        return 0
    cfg = load_config(SFTRunConfig, args.config, args.overrides)
    result = train(cfg, preflight_only=args.preflight_only)
    if args.preflight_only:
        print("\n".join(format_report(r) for r in result["preflight"].values()))
    print(json.dumps({k: v for k, v in result.items() if k not in ("preflight", "data", "versions")}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m training.sft --config X --set key=value``."""
    parser = argparse.ArgumentParser(prog="python -m training.sft", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return run(parser.parse_args(argv))
    except (ConfigError, DataFormatError, PreflightError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
