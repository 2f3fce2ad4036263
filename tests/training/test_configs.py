"""Training recipes, the merge YAML, accelerate profiles and DeepSpeed JSONs: they load, and they say how
to launch them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from memreader.core.config import load_config
from memreader.training.config import key_sets, load_train_config
from memreader.training.merge import MergeConfig

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "configs/training").glob("*_lora*.yaml"))
ACCELERATE_YAMLS = sorted((REPO / "configs/accelerate").glob("*.yaml"))
# Hardware lives in configs/accelerate and configs/deepspeed, never in a recipe.
HARDWARE_KEYS = {"deepspeed", "fsdp", "fsdp_config", "use_cpu", "local_rank", "ddp_backend", "ddp_timeout",
                 "ddp_find_unused_parameters", "fp16_backend", "tpu_num_cores", "parallelism_config"}


def _header(path: Path) -> str:
    lines = path.read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines if line.startswith("#"))


def test_recipes_exist_per_model_size():
    assert {p.name for p in RECIPES} == {"qwen2_5_1.5b_lora.yaml", "qwen2_5_3b_lora.yaml", "qwen2_5_7b_lora.yaml",
                                         "smollm2_135m_lora_cpu_smoke.yaml", "smollm2_135m_lora_structure_cpu.yaml"}


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_training_recipe_loads_with_header(path: Path, sft_files):
    header = _header(path)
    for part in ("Purpose:", "Prerequisites:", "Launch:", "Key settings:"):
        assert part in header, part
    assert str(path.relative_to(REPO)) in header, "the launch command must name this file"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert not HARDWARE_KEYS & set(data), "hardware belongs in configs/accelerate and configs/deepspeed"
    assert set(data) <= set().union(*key_sets().values()), "every key is a key of one of the three parts"
    cfg = load_train_config(path, [f"train_file={sft_files[0]}", f"val_file={sft_files[1]}"])
    assert cfg.lora.target_modules == "all-linear" and cfg.lora.task_type == "CAUSAL_LM"
    assert cfg.project.truncation_policy == "refuse" and cfg.sft.completion_only_loss is True
    if path.name.startswith("qwen2_5_"):
        size = path.name.split("_")[2]  # 1.5b / 3b / 7b
        assert cfg.project.model == f"Qwen/Qwen2.5-{size.upper()}-Instruct"
        assert "bf16" not in data, "bf16 is left to auto (on where the GPU supports it)"
        assert cfg.sft.gradient_checkpointing and cfg.sft.max_length == 8192
        assert cfg.sft.warmup_steps == 0.03 and cfg.sft.lr_scheduler_type == "cosine"
        global_batch = cfg.sft.per_device_train_batch_size * cfg.sft.gradient_accumulation_steps
        assert global_batch == 16, "the headers' 8-GPU overrides assume a 1-GPU global batch of 16"
        assert cfg.sft.model_init_kwargs["attn_implementation"] == "sdpa"
    elif "structure" in path.name:  # the real CPU run behind results/structure-adapter: dev loss and checkpoints
        assert data["bf16"] is False and cfg.sft.max_steps >= 100 and cfg.sft.eval_strategy == "steps"
        assert cfg.sft.save_strategy == "steps" and data["train_file"].endswith("structure/gen/sft_train.jsonl")
    else:
        assert data["bf16"] is False and 0 < cfg.sft.max_steps <= 10 and cfg.sft.save_strategy == "no"


def test_merge_yaml_loads_with_header():
    path = REPO / "configs/training/merge.yaml"
    header = _header(path)
    assert "Purpose:" in header and "Launch:" in header and str(path.relative_to(REPO)) in header
    cfg = load_config(MergeConfig, path)
    assert cfg.adapter.endswith("/train") and cfg.dtype == "bfloat16"


@pytest.mark.parametrize("path", ACCELERATE_YAMLS, ids=lambda p: p.stem)
def test_accelerate_profile_is_valid(path: Path):
    from accelerate.commands.config.config_args import load_config_from_file

    header = _header(path)
    assert "Purpose:" in header and "Launch:" in header and str(path.relative_to(REPO)) in header
    config = load_config_from_file(str(path))  # accelerate's own parser rejects unknown keys
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if config.distributed_type == "DEEPSPEED":
        ds_file = REPO / data["deepspeed_config"]["deepspeed_config_file"]
        assert ds_file.is_file()
        assert "mixed_precision" not in data, "precision must come from the DeepSpeed JSON's 'auto'"
    else:
        assert data["mixed_precision"] == "no", "the training YAML's bf16 must decide precision"


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_json_uses_trainer_auto_values(stage: int):
    config = json.loads((REPO / f"configs/deepspeed/zero{stage}.json").read_text(encoding="utf-8"))
    assert config["zero_optimization"]["stage"] == stage
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
                "train_batch_size"):
        assert config[key] == "auto", key
    assert config["bf16"]["enabled"] == "auto"
    assert "optimizer" not in config and "scheduler" not in config, "the training YAML owns them"
    if stage == 3:
        assert config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True


def test_the_three_parts_share_no_key_and_parse_with_trl():
    """One flat YAML is only unambiguous while MemReaderArguments, LoraConfig and SFTConfig share no key; and
    the project's dataclass stays one TRL's own parser can read (alignment-handbook style)."""
    from trl import SFTConfig, TrlParser

    from memreader.training.config import MemReaderArguments

    parts = key_sets()
    assert not parts["memreader"] & parts["lora"] and not parts["memreader"] & parts["sft"]
    assert not parts["lora"] & parts["sft"]
    parser = TrlParser([MemReaderArguments, SFTConfig])
    project, sft = parser.parse_dict({"train_file": "t.jsonl", "run": "x", "output_dir": "unused",
                                      "use_cpu": True, "bf16": False, "max_length": 64})
    assert project.train_file == "t.jsonl" and sft.max_length == 64
