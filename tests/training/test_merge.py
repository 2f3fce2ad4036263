"""Merging a LoRA adapter into its base gives a plain model with the same outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.merge import MergeError, main, merge_adapter
from training.sft import SFTRunConfig, train


@pytest.fixture
def trained_adapter(tiny_model, sft_files):
    cfg = SFTRunConfig(
        train_file=str(sft_files[0]), model=tiny_model, run="tiny-merge", lora_r=4, lora_alpha=8,
        lora_dropout=0.0, learning_rate=1e-2, max_steps=2, per_device_train_batch_size=2,
        gradient_accumulation_steps=1, max_length=512, bf16="false", gradient_checkpointing=False,
        save_steps=0, warmup_steps=0, overwrite=True, merge=True,
    )
    summary = train(cfg)
    assert (Path(summary["merged_dir"]) / "model.safetensors").is_file()  # merge=true merged after training
    return summary["run_dir"]


def test_merged_model_matches_adapter(trained_adapter, tiny_model, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = merge_adapter(trained_adapter, str(tmp_path / "merged"))
    assert (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file()
    assert not (out / "adapter_config.json").exists()
    manifest = json.loads((out / "merge_manifest.json").read_text())
    assert manifest["base"] == tiny_model  # read from the run's summary.json

    ids = torch.tensor([[1, 520, 9531, 198, 4093, 2683, 359]])
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with torch.no_grad():
        base_logits = base(ids).logits
        peft_logits = PeftModel.from_pretrained(base, trained_adapter).eval()(ids).logits
        merged_logits = AutoModelForCausalLM.from_pretrained(out).eval()(ids).logits
    assert not torch.allclose(base_logits, peft_logits), "the adapter must change the outputs"
    torch.testing.assert_close(merged_logits, peft_logits, atol=1e-4, rtol=1e-4)

    with pytest.raises(MergeError, match="not empty"):
        merge_adapter(trained_adapter, str(out))


def test_merge_errors_name_the_fix(tmp_path, capsys):
    with pytest.raises(MergeError, match="no adapter_config.json"):
        merge_adapter(str(tmp_path))
    assert main(["--adapter", str(tmp_path)]) == 2
    assert "no adapter_config.json" in capsys.readouterr().err
