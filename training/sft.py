"""LoRA SFT of MemReader with TRL + PEFT (+ accelerate / DeepSpeed): loss on the completion only.

``memreader train --config ... --set key=value`` (= ``python -m memreader.training.sft``): reads ``sft_train.jsonl``
/ ``sft_val.jsonl`` (checked by :mod:`memreader.training.preflight`) with the config of
:mod:`memreader.training.config` and writes the adapter, ``summary.json`` and curves to ``<run>/train/``.
Details (data, launching on 1-N GPUs / nodes / CPU processes, outputs): docs/TRAINING.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

from memreader.core.config import ConfigError
from memreader.core.paths import sha256_file, write_json, write_jsonl, write_resolved_config
from memreader.core.registry import resolve_model
from memreader.core.stage import PrintAction, Stage
from memreader.training.completion_head import score_completion_only
from memreader.training.config import (
    TrainConfig,
    describe_keys,
    load_train_config,
    resolved_values,
    world_size,
)
from memreader.training.preflight import (
    check_lengths,
    format_report,
    load_sft_records,
)

log = logging.getLogger(__name__)

CHECKPOINT_DONE = "memreader_checkpoint.json"
"""Written into ``checkpoint-N/`` by rank 0 once every process has saved its part of it (its RNG state; its ZeRO
shards). The Trainer writes a checkpoint in place, rank by rank, so a run killed while saving leaves a
``checkpoint-N`` that cannot be resumed; ``resume: true`` takes the newest checkpoint that holds this file."""


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


def build_trainer(
    cfg: TrainConfig, model_path: str, tokenizer: Any,
    train_records: list[dict[str, Any]], val_records: list[dict[str, Any]] | None = None,
) -> Any:
    """An ``SFTTrainer`` with ``cfg.sft`` whose model is ``model_path`` wrapped with a fresh ``cfg.lora`` adapter."""
    from trl import SFTTrainer

    args = cfg.sft
    if args.padding_free and not args.packing and args.max_length is not None:
        # TRL refuses padding-free batches with a max_length it would not enforce; the pre-flight has already held
        # every record to max_length (refused, or dropped by truncation_policy), so the inputs are within it
        args = copy.copy(args)
        args.max_length = None
    trainer = SFTTrainer(
        model=model_path,  # a path: TRL loads it (with model_init_kwargs) after ZeRO-3 setup
        args=args,
        train_dataset=records_to_dataset(train_records),
        eval_dataset=records_to_dataset(val_records) if val_records else None,
        processing_class=tokenizer,
        peft_config=copy.deepcopy(cfg.lora),  # PEFT rewrites its config (target_modules expanded) when wrapping
        callbacks=[checkpoint_done_callback(), schedule_from_args_callback()],
    )
    if cfg.project.completion_head and not score_completion_only(trainer.model):
        log.info("completion_head: this model's logits are scaled, soft-capped or routed; TRL's LM head scores it")
    if cfg.project.compile_layers:
        if cfg.sft.torch_compile:
            raise ConfigError("compile_layers and torch_compile both set: pick one (compile_layers compiles each "
                              "decoder layer, torch_compile the whole model)")
        log.info("compiled %d decoder layers (torch.compile per layer)", compile_decoder_layers(trainer.model))
    return trainer


def checkpoint_done_callback() -> Any:
    """A ``TrainerCallback`` that marks every saved checkpoint finished (:data:`CHECKPOINT_DONE`): ``on_save`` runs on
    every process after its own part of the save, so rank 0 writes the mark after a barrier."""
    from accelerate import PartialState
    from transformers import TrainerCallback

    class MarkCheckpointDone(TrainerCallback):
        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            PartialState().wait_for_everyone()
            if state.is_world_process_zero:
                folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                write_json(folder / CHECKPOINT_DONE, {"step": state.global_step, "world_size": args.world_size})
            return control

    return MarkCheckpointDone()


def schedule_from_args_callback() -> Any:
    """A ``TrainerCallback`` that makes a resumed run log, evaluate and save on *this* run's ``logging_steps``,
    ``eval_steps`` and ``save_steps``: transformers restores them from the checkpoint's ``trainer_state.json`` and
    only warns, so ``--set save_steps=50`` on a resume would silently keep the old schedule. Each value that changes
    is said once."""
    from transformers import TrainerCallback

    class ScheduleFromArgs(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            before = {kind: getattr(state, f"{kind}_steps") for kind in ("logging", "eval", "save")}
            state.compute_steps(args, state.max_steps)
            changed = [f"{kind}_steps {old} -> {getattr(state, f'{kind}_steps')}" for kind, old in before.items()
                       if old != getattr(state, f"{kind}_steps")]
            if changed and state.is_world_process_zero:
                log.info("resumed with this run's schedule, not the checkpoint's: %s", ", ".join(changed))
            return control

    return ScheduleFromArgs()


def resume_checkpoint(out: Path) -> Path:
    """The newest ``checkpoint-N`` in ``out`` that every process finished saving (:data:`CHECKPOINT_DONE`); newer
    unfinished ones are named in a warning and left alone. Raises :class:`ConfigError` when there is none."""
    numbered = (re.fullmatch(r"checkpoint-(\d+)", p.name) for p in out.glob("checkpoint-*") if p.is_dir())
    folders = sorted((int(m.group(1)), out / m.group(0)) for m in numbered if m)
    for _, folder in reversed(folders):
        if (folder / CHECKPOINT_DONE).is_file():
            return folder
        log.warning("%s is unfinished (no %s: the run stopped while saving it); resuming from an earlier one",
                    folder, CHECKPOINT_DONE)
    if folders:
        raise ConfigError(f"resume=true but no checkpoint in {out} was finished ({', '.join(f.name for _, f in folders)} "
                          f"lack {CHECKPOINT_DONE}, which rank 0 writes once every process has saved); a checkpoint "
                          "saved before memreader wrote that mark has none either: if you know it is whole, create "
                          "the file with {} in it")
    raise ConfigError(f"resume=true but {out} holds no checkpoint-* folder; train with save_strategy: steps "
                      "(and save_steps) first")


def compile_decoder_layers(model: Any) -> int:
    """``torch.compile`` every decoder layer of ``model`` (a PEFT-wrapped or plain causal LM) but the first;
    returns how many were compiled.

    Per layer rather than the whole model (``SFTConfig.torch_compile``): identical layers share one graph,
    so compiling is quick, and the LM head and TRL's loss stay eager. Layer 0 is skipped because its input
    (the frozen embeddings' output) needs no grad while the others' does, which would compile a second
    variant of the graph for one layer. Raises :class:`ConfigError` for a model without a decoder layer list.
    """
    import torch

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise ConfigError(f"compile_layers: {type(base).__name__} has no decoder layer list (get_decoder().layers); "
                          "set compile_layers=false, or torch_compile=true to compile the whole model")
    dynamo_config = torch._dynamo.config
    dynamo_config.cache_size_limit = max(dynamo_config.cache_size_limit, 64)
    for layer in layers[1:]:
        layer.compile(dynamic=False)
    return len(layers) - 1


def carried_checkpoint(cfg: TrainConfig) -> Path | None:
    """The checkpoint folder ``resume_from_checkpoint`` names (TRL's key, which ``Trainer.train`` itself ignores), e.g.
    one committed by a run on another machine: checked here, before the model loads. ``None`` when unset."""
    given = cfg.sft.resume_from_checkpoint
    if not given:
        return None
    if cfg.project.resume:
        raise ConfigError("resume=true and resume_from_checkpoint are both set: resume=true continues from the run "
                          "folder's newest checkpoint, resume_from_checkpoint from the folder it names; pick one")
    folder = Path(given)
    if not (folder / "trainer_state.json").is_file() or not any(folder.glob("adapter_model.*")):
        raise ConfigError(f"resume_from_checkpoint={given}: {folder} is not a checkpoint folder (it needs the "
                          "trainer_state.json and adapter_model.safetensors a run's checkpoint-N holds); point it at "
                          "one, e.g. <run>/train/checkpoint-500")
    return folder


def _summarize(cfg: TrainConfig, trainer: Any, seconds: float, counts: dict[str, int],
               resumed_from: Path | None, start: int) -> dict[str, Any]:
    """summary.json; on a resumed run the loss fields cover the whole run (the log history comes back with the
    checkpoint) and ``seconds``, ``tokens`` and the speeds this launch only."""
    import torch.distributed as dist

    history = trainer.state.log_history
    losses = [h["loss"] for h in history if "loss" in h]
    # TRL counts num_tokens from 0 in every launch (its counter is not in the checkpoint)
    tokens = max((h.get("num_tokens", 0) for h in history if h.get("step", 0) > start), default=0)
    eval_losses = [h["eval_loss"] for h in history if "eval_loss" in h]
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    steps = trainer.state.global_step
    return {
        "model": cfg.project.model,
        "steps": steps,
        "resumed_from": resumed_from.name if resumed_from else None,
        "epochs": round(float(trainer.state.epoch or 0.0), 4),
        "seconds": round(seconds, 2),
        "steps_per_second": round((steps - start) / seconds, 4) if seconds else None,
        "tokens": int(tokens),
        "tokens_per_second": round(tokens / seconds, 1) if seconds else None,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "min_loss": min(losses) if losses else None,
        "last_eval_loss": eval_losses[-1] if eval_losses else None,
        "trainable_params": int(trainable),
        "world_size": trainer.args.world_size,
        "backend": dist.get_backend() if dist.is_available() and dist.is_initialized() else None,
        "device": str(trainer.args.device),
        "bf16": bool(trainer.args.bf16),
        **counts,
        **_provenance(cfg),
    }


def _provenance(cfg: TrainConfig) -> dict[str, Any]:
    """The data files' hashes and the library versions, for summary.json."""
    import peft
    import torch
    import transformers
    import trl

    data = cfg.project
    return {"data": {"train_file": data.train_file, "train_sha256": sha256_file(data.train_file),
                     "val_file": data.val_file, "val_sha256": sha256_file(data.val_file) if data.val_file else None},
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "trl": trl.__version__, "peft": peft.__version__}}


def train(cfg: TrainConfig, preflight_only: bool = False) -> dict[str, Any]:
    """Pre-flight, LoRA SFT, and save everything into the run folder; returns the summary dict. On several
    processes every one trains, and only rank 0 writes the run folder (checkpoints: each rank its RNG state)."""
    project, args = cfg.project, cfg.sft
    if project.run is None and world_size() > 1:
        raise ConfigError("run is not set: every process must write to the same folder, so pass --set run=NAME")
    out = cfg.output_dir  # $MEMREADER_HOME/runs/<run>/train, named when the config was built
    out.mkdir(parents=True, exist_ok=True)
    if project.cut_only:
        if world_size() > 1:
            raise ConfigError("cut_only fits the cut head in one process: launch it without accelerate / torchrun")
        return {"run_dir": str(out), "cut_head": fit_cut(cfg)}
    carried = carried_checkpoint(cfg)
    if not preflight_only and not (project.resume or carried or project.overwrite) \
            and (out / "adapter_config.json").exists():
        raise ConfigError(f"{out} already holds a trained adapter; pick another run name, or set "
                          "overwrite=true (start again) or resume=true (continue from the last checkpoint)")
    with args.main_process_first(desc="resolve model"):  # converts the embedded model once per node
        model_path = resolve_model(project.model)
    tokenizer = load_tokenizer(model_path)

    train_records, train_report = check_lengths(
        load_sft_records(project.train_file), tokenizer, args.max_length, project.truncation_policy, "train")
    reports = {"train": train_report}
    val_records = None
    if project.val_file:
        val_records, reports["val"] = check_lengths(
            load_sft_records(project.val_file), tokenizer, args.max_length, project.truncation_policy, "val")
    if args.process_index == 0:
        write_json(out / "preflight.json", {"model": project.model, "tokenizer": model_path, **reports})
        write_resolved_config(out, resolved_values(cfg))
    for report in reports.values():
        log.info("pre-flight\n%s", format_report(report))
    counts = {f"{split}_examples": r["kept"] for split, r in reports.items()}
    counts.update({f"{split}_dropped": r["dropped"] for split, r in reports.items()})
    if preflight_only:
        return {"run_dir": str(out), "preflight": reports}

    resume_from = carried or (resume_checkpoint(out) if project.resume else None)
    # the step it starts from, read now: the checkpoint may be rotated away (save_total_limit) before the run ends
    first_step = json.loads((resume_from / "trainer_state.json").read_text(encoding="utf-8"))["global_step"] \
        if resume_from else 0
    trainer = build_trainer(cfg, model_path, tokenizer, train_records, val_records)
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    seconds = time.perf_counter() - start
    if val_records and args.eval_strategy == "no":
        trainer.evaluate()
    trainer.save_model(str(out))  # adapter + tokenizer (gathers ZeRO-3 shards)
    summary = _summarize(cfg, trainer, seconds, counts, resume_from, first_step)
    if trainer.is_world_process_zero():
        (out / "trainer_args.json").write_text(args.to_json_string(), encoding="utf-8")
        write_jsonl(out / "curves.jsonl", trainer.state.log_history)
        write_json(out / "summary.json", summary)
        if project.merge:
            from memreader.training.merge import merge_adapter

            summary["merged_dir"] = str(merge_adapter(str(out), str(out / "merged"), base=project.model,
                                                         overwrite=project.overwrite))
        if project.cut_head:  # beside the adapter, in the same run folder; its record goes into the summary
            summary["cut_head"] = fit_cut(cfg)
            write_json(out / "summary.json", summary)
        log.info("trained to step %d%s in %.1f s (%.3f steps/s, %.0f tokens/s), loss %.4f -> %.4f; adapter in %s",
                 summary["steps"], f" from {resume_from.name}" if resume_from else "", seconds,
                 summary["steps_per_second"] or 0, summary["tokens_per_second"] or 0,
                 summary["first_loss"] or float("nan"), summary["last_loss"] or float("nan"), out)
    summary["run_dir"] = str(out)
    return summary


def fit_cut(cfg: TrainConfig) -> dict[str, Any]:
    """Fit the cut head (:mod:`memreader.training.cut_fit`) into ``cut_dir`` or ``<run>/train/cut_head``; returns
    what the summary keeps of it (where, threshold, tuning scores, curves)."""
    from memreader.training.cut_fit import FOLDER, CutFitSettings, fit_cut_head

    p = cfg.project
    folder = Path(p.cut_dir) if p.cut_dir else cfg.output_dir / FOLDER
    meta = fit_cut_head(CutFitSettings(data=p.cut_data, model=p.model, layers=p.cut_layers, hidden=p.cut_hidden,
                                       epochs=p.cut_epochs, seed=cfg.sft.seed, cache_dir=p.cut_cache,
                                       drop=p.cut_drop), folder)
    return {"dir": str(folder), "threshold": meta["threshold"], **{k: meta["fit"][k] for k in (
        "documents", "ends", "best_epoch", "tune_loss", "tune_f1", "seconds")}, "curves": meta["curves"]}


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preflight-only", action="store_true",
                        help="only measure token lengths and write preflight.json; do not train")
    parser.add_argument("--list-keys", action=PrintAction, text=describe_keys,
                        help="print every config key (MemReaderArguments, peft.LoraConfig, trl.SFTConfig) and exit")


def close_processes() -> None:
    """After a successful multi-process run: wait for every process, then destroy the process group. Left to the
    interpreter's exit, gloo's worker threads abort the process ("terminate called without an active exception",
    SIGABRT; measured here: 11 of 12 two-process gloo jobs without it, 0 of 12 with it; pytorch/pytorch#190489), and
    the launcher reports a finished run as failed. Never after an error: a process still waiting in a collective
    would hang the others (pytorch/torchtitan#1342)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        from accelerate import PartialState

        PartialState().wait_for_everyone()
        dist.destroy_process_group()


def _run_stage(cfg: Any, args: argparse.Namespace) -> int:
    result = train(cfg, preflight_only=args.preflight_only)
    main = cfg.sft.process_index == 0  # any launcher (torchrun, DeepSpeed, mpirun), read before the group closes
    close_processes()
    if not main:  # one report per launch, not one per process
        return 0
    if args.preflight_only:
        print("\n".join(format_report(r) for r in result["preflight"].values()))
    shown = {k: v for k, v in result.items() if k not in ("preflight", "data", "versions")}
    if "cut_head" in shown:  # its per-epoch curve is in the summary and head.json, not on the console
        shown["cut_head"] = {k: v for k, v in shown["cut_head"].items() if k != "curves"}
    print(json.dumps(shown, indent=2))
    return 0


STAGE = Stage("train", "LoRA fine-tuning with TRL SFTTrainer", run=_run_stage, load=load_train_config,
              example_dir="configs/training/", arguments=_arguments, needs_args=True,
              models=lambda cfg: {"model": cfg.project.model},
              epilog="Config keys: every key of trl.SFTConfig (transformers.TrainingArguments), of peft.LoraConfig "
                     "and of memreader.training.config.MemReaderArguments, in the YAML or as --set key=value; --list-keys "
                     "prints them with their defaults.")

if __name__ == "__main__":  # also `accelerate launch -m memreader.training.sft --config ...`
    from memreader.cli import module_main

    raise SystemExit(module_main("train"))
