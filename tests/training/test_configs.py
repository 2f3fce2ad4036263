"""Training YAMLs, accelerate profiles and DeepSpeed JSONs: they load, and they say how to launch them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from memreader.config import load_config
from training.sft import SFTRunConfig

REPO = Path(__file__).resolve().parents[2]
TRAINING_YAMLS = sorted((REPO / "configs/training").rglob("*.yaml"))
ACCELERATE_YAMLS = sorted((REPO / "configs/accelerate").glob("*.yaml"))


def _header(path: Path) -> str:
    lines = path.read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines if line.startswith("#"))


@pytest.mark.parametrize("path", TRAINING_YAMLS, ids=lambda p: p.stem)
def test_training_yaml_loads_with_header(path: Path, sft_files):
    header = _header(path)
    assert "Purpose:" in header and "Prerequisites:" in header and "Launch:" in header
    assert str(path.relative_to(REPO)) in header, "the launch command must name this file"
    cfg = load_config(SFTRunConfig, path, [f"train_file={sft_files[0]}", f"val_file={sft_files[1]}"])
    assert cfg.lora_target_modules == "all-linear"
    assert cfg.truncation_policy == "refuse"
    if "qwen2_5" in path.parts:
        assert cfg.model.startswith("Qwen/Qwen2.5-") and cfg.model.endswith("-Instruct")
        assert cfg.bf16 == "auto" and cfg.gradient_checkpointing
    else:
        assert cfg.bf16 == "false" and 0 < cfg.max_steps <= 10


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
