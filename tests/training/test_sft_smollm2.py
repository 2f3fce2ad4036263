"""Integration: two real LoRA steps on the embedded SmolLM2-135M-Instruct with the CPU smoke YAML."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memreader.core.registry import SMOLLM2
from memreader.training.config import load_train_config
from memreader.training.sft import train

SMOKE_YAML = Path(__file__).resolve().parents[2] / "configs/training/smollm2_135m_lora_cpu_smoke.yaml"


@pytest.mark.integration
def test_two_lora_steps_on_smollm2(smollm2_path, tiny_records, write_jsonl):
    from safetensors.torch import load_file

    train_file = write_jsonl("train.jsonl", tiny_records)
    cfg = load_train_config(SMOKE_YAML, [
        f"train_file={train_file}", "val_file=null", "max_steps=2", "run=smollm2-two-steps", "overwrite=true",
    ])
    assert cfg.project.model == SMOLLM2
    summary = train(cfg)
    assert summary["steps"] == 2 and summary["device"] == "cpu" and not summary["bf16"]
    assert summary["first_loss"] is not None and summary["last_loss"] is not None
    out = Path(summary["run_dir"])
    adapter_config = json.loads((out / "adapter_config.json").read_text())
    assert adapter_config["r"] == cfg.lora.r
    # all-linear: attention and MLP projections, never lm_head
    assert {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"} <= set(
        adapter_config["target_modules"])
    weights = load_file(out / "adapter_model.safetensors")
    lora_b = [t for k, t in weights.items() if "lora_B" in k]
    assert len(lora_b) == 30 * 7 and all(t.abs().max() > 0 for t in lora_b)
