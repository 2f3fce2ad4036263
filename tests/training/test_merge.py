"""Merging a LoRA adapter into its base gives a plain model with the same outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memreader.cli import main as cli
from memreader.training.config import make_train_config
from memreader.training.merge import MergeError, merge_adapter
from memreader.training.sft import train


@pytest.fixture
def trained_adapter(tiny_model, sft_files):
    cfg = make_train_config(dict(
        train_file=str(sft_files[0]), model=tiny_model, run="tiny-merge", r=4, lora_alpha=8,
        lora_dropout=0.0, learning_rate=1e-2, max_steps=2, per_device_train_batch_size=2,
        gradient_accumulation_steps=1, max_length=512, bf16=False, gradient_checkpointing=False,
        save_strategy="no", warmup_steps=0, overwrite=True, merge=True,
    ))
    summary = train(cfg)
    assert (Path(summary["merged_dir"]) / "model.safetensors").is_file()  # merge=true merged after training
    return summary["run_dir"]


@pytest.mark.integration
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


@pytest.mark.integration
def test_merge_cli_takes_config_and_set(trained_adapter, tmp_path, capsys):
    """--config + --set like every stage (shortcut flags still work), the resolved config beside the model."""
    import yaml

    config = tmp_path / "merge.yaml"
    config.write_text(f"adapter: {trained_adapter}\ndtype: bfloat16\n", encoding="utf-8")
    out = tmp_path / "via-cli"
    assert cli(["merge", "--config", str(config), "--set", f"output={out}", "--dtype", "float32"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    written = yaml.safe_load((out / "merge_config.yaml").read_text(encoding="utf-8"))
    assert written == {"adapter": trained_adapter, "base": None, "output": str(out), "dtype": "float32",
                       "overwrite": False}
    assert json.loads((out / "merge_manifest.json").read_text())["dtype"] == "torch.float32"
    assert cli(["merge", "--set", f"adapter={trained_adapter}", "--set", f"output={out}"]) == 2  # not empty
    assert "overwrite=true" in capsys.readouterr().err


def test_merge_errors_name_the_fix(tmp_path, capsys):
    with pytest.raises(MergeError, match="no adapter_config.json"):
        merge_adapter(str(tmp_path))
    assert cli(["merge", "--adapter", str(tmp_path)]) == 2
    assert "no adapter_config.json" in capsys.readouterr().err
    assert cli(["merge", "--set", f"adapter={tmp_path}", "--set", "dtype=fp8", "--set", "colour=red"]) == 2
    err = capsys.readouterr().err
    assert "dtype='fp8': use one of auto, float32, bfloat16, float16" in err and "unknown key 'colour'" in err
