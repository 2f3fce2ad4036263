"""LoRA SFT with TRL on a tiny random Llama: completion-only labels, weights move, loss falls, run folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from memreader.cli import main as cli
from memreader.core.config import ConfigError
from memreader.training.config import TrainConfig, load_train_config, make_train_config
from memreader.training.preflight import PreflightError
from memreader.training.sft import build_trainer, load_tokenizer, train

REPO = Path(__file__).resolve().parents[2]
SMOKE_YAML = REPO / "configs/training/smollm2_135m_lora_cpu_smoke.yaml"


def _cfg(tiny_model: str, train_file: Path, **kw) -> TrainConfig:
    base = dict(
        train_file=str(train_file), model=tiny_model, r=8, lora_alpha=16, lora_dropout=0.0,
        learning_rate=3e-2, lr_scheduler_type="constant", warmup_steps=0, max_steps=6,
        per_device_train_batch_size=2, gradient_accumulation_steps=1, max_length=512, bf16=False,
        gradient_checkpointing=False, logging_steps=1, save_strategy="no", seed=0,
    )
    base.update(kw)
    return make_train_config(base)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _lora_tensors(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


@pytest.mark.integration
def test_collated_labels_mask_the_prompt(tiny_model, sft_files):
    from memreader.training.preflight import measure

    cfg = _cfg(tiny_model, sft_files[0], run="tiny-labels")
    tokenizer = load_tokenizer(tiny_model)
    records = _records(sft_files[1])
    trainer = build_trainer(cfg, tiny_model, tokenizer, records)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(records))])
    lengths = measure(records, tokenizer)
    for row, (record, length) in enumerate(zip(records, lengths, strict=True)):
        ids, labels = batch["input_ids"][row], batch["labels"][row]
        assert (labels[:length.prompt] == -100).all(), "prompt tokens must not be trained on"
        assert (labels[length.prompt:length.total] == ids[length.prompt:length.total]).all()
        assert (labels[length.total:] == -100).all(), "padding must not be trained on"
        target = tokenizer.decode(labels[length.prompt:length.total])
        assert target.startswith(record["completion"][0]["content"])
        assert target.rstrip().endswith(tokenizer.eos_token)


@pytest.mark.integration
def test_lora_weights_move_and_loss_falls(tiny_model, sft_files):
    cfg = _cfg(tiny_model, sft_files[0], max_steps=8, run="tiny-moves")
    tokenizer = load_tokenizer(tiny_model)
    trainer = build_trainer(cfg, tiny_model, tokenizer, _records(sft_files[0]))
    before = _lora_tensors(trainer.model)
    assert before and all((t == 0).all() for n, t in before.items() if "lora_B" in n)
    base_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" not in n}
    trainer.train()
    after = _lora_tensors(trainer.model)
    assert all(not (after[n] == 0).all() for n in after if "lora_B" in n), "every lora_B must leave zero"
    assert all(not after[n].equal(before[n]) for n in after if "lora_A" in n)
    assert all(p.equal(base_before[n]) for n, p in trainer.model.named_parameters() if "lora_" not in n)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 8
    assert losses[-1] < 0.8 * losses[0], losses


@pytest.mark.integration
def test_train_writes_run_folder(tiny_model, sft_files, training_home):
    cfg = _cfg(tiny_model, sft_files[0], val_file=str(sft_files[1]), run="tiny-e2e")
    summary = train(cfg)
    out = training_home / "runs" / "tiny-e2e" / "train"
    assert Path(summary["run_dir"]) == out
    for name in ("adapter_config.json", "adapter_model.safetensors", "tokenizer_config.json", "config.yaml",
                 "trainer_args.json", "curves.jsonl", "summary.json", "preflight.json"):
        assert (out / name).is_file(), name
    from safetensors.torch import load_file

    adapter = load_file(out / "adapter_model.safetensors")
    assert any("lora_B" in k for k in adapter) and all(t.abs().sum() > 0 for k, t in adapter.items() if "lora_B" in k)
    curves = [json.loads(line) for line in (out / "curves.jsonl").read_text().splitlines()]
    assert sum("loss" in c for c in curves) == 6 and any("eval_loss" in c for c in curves)
    written = json.loads((out / "summary.json").read_text())
    assert written["steps"] == 6 and written["train_examples"] == 16 and written["val_examples"] == 4
    assert written["last_loss"] < written["first_loss"]
    assert written["tokens"] > 0 and written["tokens_per_second"] > 0 and written["last_eval_loss"] is not None
    preflight = json.loads((out / "preflight.json").read_text())
    assert preflight["train"]["examples"] == 16 and preflight["val"]["examples"] == 4
    args = json.loads((out / "trainer_args.json").read_text())
    assert args["completion_only_loss"] is True and args["output_dir"] == str(out) and args["max_steps"] == 6
    # config.yaml holds all three parts and rebuilds the same config (on this machine: same derived values)
    written = yaml.safe_load((out / "config.yaml").read_text())
    assert written["train_file"] == str(sft_files[0]) and written["r"] == 8 and written["max_steps"] == 6
    assert "output_dir" not in written and "hub_token" not in written
    again = load_train_config(out / "config.yaml")
    assert again.sft.to_dict() == cfg.sft.to_dict() and again.lora.to_dict() == cfg.lora.to_dict()
    assert again.project == cfg.project
    with pytest.raises(ConfigError, match="already holds a trained adapter"):
        train(cfg)


@pytest.mark.integration
def test_a_checkpoint_carried_from_another_machine_resumes(tiny_model, sft_files, training_home, tmp_path):
    """``resume_from_checkpoint`` (which Trainer.train ignores) continues from a folder outside the run, holding only
    what a commit carries (no training_args.bin, no tokenizer files), with the losses of the run that wrote it."""
    import shutil

    first = train(_cfg(tiny_model, sft_files[0], max_steps=4, save_strategy="steps", save_steps=2, run="tiny-carry-a"))
    carried = tmp_path / "carried" / "step-2"
    shutil.copytree(Path(first["run_dir"]) / "checkpoint-2", carried,
                    ignore=shutil.ignore_patterns("training_args.bin", "tokenizer*", "chat_template*"))
    resumed = train(_cfg(tiny_model, sft_files[0], max_steps=4, save_strategy="steps", save_steps=1,
                         run="tiny-carry-b", resume_from_checkpoint=str(carried)))
    assert resumed["resumed_from"] == "step-2" and resumed["steps"] == 4
    # this run's save_steps=1, not the checkpoint's 2 (which transformers restores from trainer_state.json)
    saved = sorted(p.name for p in Path(resumed["run_dir"]).glob("checkpoint-*"))
    assert saved == ["checkpoint-3", "checkpoint-4"], saved
    curve = {h["step"]: h["loss"] for h in _curve(first) if "loss" in h}
    again = {h["step"]: h["loss"] for h in _curve(resumed) if "loss" in h}
    assert set(again) == {1, 2, 3, 4}  # the first two come back with the checkpoint's log history
    for step in (3, 4):
        assert again[step] == pytest.approx(curve[step], rel=1e-4), step


def _curve(summary: dict) -> list[dict]:
    return [json.loads(line) for line in (Path(summary["run_dir"]) / "curves.jsonl").read_text().splitlines()]


def test_a_carried_checkpoint_is_checked_before_the_model_loads(sft_files, tmp_path):
    with pytest.raises(ConfigError, match="is not a checkpoint folder"):
        train(_cfg("no-such-model", sft_files[0], run="tiny-carry-bad", resume_from_checkpoint=str(tmp_path)))
    with pytest.raises(ConfigError, match="pick one"):
        train(_cfg("no-such-model", sft_files[0], run="tiny-carry-bad", resume=True,
                   resume_from_checkpoint=str(tmp_path)))


@pytest.mark.integration
def test_refuse_stops_before_training(tiny_model, tiny_records, write_jsonl, training_home):
    long = dict(tiny_records[0], id="too-long")
    long["prompt"] = [long["prompt"][0], {"role": "user", "content": "word " * 400}]
    path = write_jsonl("long.jsonl", tiny_records + [long])
    with pytest.raises(PreflightError, match="too-long"):
        train(_cfg(tiny_model, path, max_length=256, run="tiny-refuse"))
    assert not (training_home / "runs" / "tiny-refuse" / "train" / "adapter_config.json").exists()


def test_config_collects_every_problem(sft_files):
    with pytest.raises(ConfigError) as err:
        load_train_config(SMOKE_YAML, [f"train_file={sft_files[0]}", "val_file=null", "r=0", "lora_r=4",
                                       "truncation_policy=cut", "bf16=maybe", "deepspeed=nope.json",
                                       "learning_rat=1e-4", "eval_strategy=steps", "output_dir=/tmp/x"])
    message = str(err.value)
    for needle in ("r=0 is out of range", "truncation_policy='cut'", "bf16: expected true/false, got 'maybe'",
                   "deepspeed='nope.json'", "unknown key 'lora_r': it is now r",
                   "unknown key 'learning_rat'; the nearest valid key is 'learning_rate'",
                   "eval_strategy='steps' evaluates on val_file", "output_dir is derived from run"):
        assert needle in message, needle


def test_every_sft_and_lora_key_is_reachable(sft_files):
    """Keys the project never names reach TRL and PEFT, typed from --set strings."""
    cfg = load_train_config(SMOKE_YAML, [
        f"train_file={sft_files[0]}", "val_file=null", "run=reach",
        "learning_rate=1e-4", "neftune_noise_alpha=5", "optim=adamw_torch", "packing=true", "max_length=null",
        "gradient_checkpointing_kwargs={use_reentrant: false}", "dataset_num_proc=2", "use_rslora=true",
        "target_modules=[q_proj,v_proj]", "init_lora_weights=gaussian", "modules_to_save=[lm_head]",
        "model_init_kwargs={attn_implementation: eager}", "warmup_steps=0.1",
    ])
    sft, lora = cfg.sft, cfg.lora
    assert sft.learning_rate == 1e-4 and sft.neftune_noise_alpha == 5.0 and sft.optim == "adamw_torch"
    assert sft.packing is True and sft.max_length is None and sft.dataset_num_proc == 2
    assert sft.gradient_checkpointing_kwargs == {"use_reentrant": False}
    assert sft.model_init_kwargs == {"attn_implementation": "eager", "dtype": "float32"}  # dtype: project default
    assert sft.warmup_steps == 0.1 and sft.get_warmup_steps(200) == 20  # a float below 1 is a ratio
    assert lora.use_rslora and lora.init_lora_weights == "gaussian" and lora.modules_to_save == ["lm_head"]
    assert lora.target_modules == {"q_proj", "v_proj"} and lora.task_type == "CAUSAL_LM"
    # project defaults that differ from TRL's
    assert sft.completion_only_loss is True and sft.logging_first_step and sft.report_to in ([], ["none"])
    assert sft.output_dir.endswith("runs/reach/train") and sft.run_name == "reach" and sft.use_cpu


def test_yaml_boolean_for_a_word_is_named(sft_files):
    with pytest.raises(ConfigError, match=r"save_strategy: got the YAML boolean False.*quote it"):
        load_train_config(SMOKE_YAML, [f"train_file={sft_files[0]}", "save_strategy=no"])
    cfg = load_train_config(SMOKE_YAML, [f"train_file={sft_files[0]}", "val_file=null", 'save_strategy="no"'])
    assert cfg.sft.save_strategy == "no"


def test_library_validation_is_reported(sft_files):
    with pytest.raises(ConfigError, match="trl.SFTConfig refused the values"):
        load_train_config(SMOKE_YAML, [f"train_file={sft_files[0]}", "val_file=null", "bf16=true", "fp16=true"])


@pytest.mark.integration
def test_main_preflight_only_and_error_exit(tiny_model, sft_files, capsys, training_home):
    args = ["--config", str(SMOKE_YAML), "--set", f"train_file={sft_files[0]}", "--set", "val_file=null",
            "--set", f"model={tiny_model}", "--set", "run=tiny-pre", "--preflight-only"]
    assert cli(["train", *args]) == 0
    assert "total_tokens" in capsys.readouterr().out
    assert (training_home / "runs" / "tiny-pre" / "train" / "preflight.json").is_file()
    assert not (training_home / "runs" / "tiny-pre" / "train" / "adapter_config.json").exists()
    assert cli(["train", "--config", str(SMOKE_YAML), "--set", "train_file=missing.jsonl"]) == 2
    assert "train_file='missing.jsonl': file not found" in capsys.readouterr().err


@pytest.mark.integration
def test_compile_layers_compiles_every_decoder_layer_but_the_first(tiny_model, sft_files):
    cfg = _cfg(tiny_model, sft_files[0], run="tiny-compile", compile_layers=True)
    trainer = build_trainer(cfg, tiny_model, load_tokenizer(tiny_model), _records(sft_files[1]))
    layers = trainer.model.get_base_model().get_decoder().layers
    assert len(layers) >= 2
    assert layers[0]._compiled_call_impl is None
    assert all(layer._compiled_call_impl is not None for layer in layers[1:])
    plain = build_trainer(_cfg(tiny_model, sft_files[0], run="tiny-eager"), tiny_model,
                          load_tokenizer(tiny_model), _records(sft_files[1]))
    assert all(layer._compiled_call_impl is None for layer in plain.model.get_base_model().get_decoder().layers)


@pytest.mark.integration
def test_compile_layers_refuses_torch_compile_too(tiny_model, sft_files):
    cfg = _cfg(tiny_model, sft_files[0], run="tiny-compile-both", compile_layers=True, torch_compile=True)
    with pytest.raises(ConfigError, match="pick one"):
        build_trainer(cfg, tiny_model, load_tokenizer(tiny_model), _records(sft_files[1]))


def test_compile_decoder_layers_names_a_model_without_layers():
    import torch

    from memreader.training.sft import compile_decoder_layers

    with pytest.raises(ConfigError, match="no decoder layer list"):
        compile_decoder_layers(torch.nn.Linear(2, 2))
