"""The embedded SmolLM2 conversion: plain fp32 folder, no stale GGUF quantization, rebuilt when outdated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memreader.core import registry


@pytest.mark.integration
def test_converted_folder_is_a_plain_trainable_model(smollm2_path: str) -> None:
    folder = Path(smollm2_path)
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config  # transformers would refuse to fine-tune it
    assert json.loads((folder / registry._MARKER).read_text()) == registry._CONVERSION
    assert list(folder.glob("*.safetensors")) and (folder / "tokenizer.json").is_file()


def test_outdated_conversion_is_rebuilt(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path))
    target = tmp_path / "models" / registry.SMOLLM2
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")  # a folder from an older conversion: no marker
    calls = []
    monkeypatch.setattr(registry, "_convert_smollm2", lambda t: calls.append(t) or t)
    assert registry.resolve_model("smollm2") == str(target)
    assert calls == [target]


def test_unknown_names_fail_with_the_fix() -> None:
    with pytest.raises(registry.ModelNotFoundError, match="hub id"):
        registry.resolve_model("no-such-model")
    assert registry.resolve_model("Qwen/Qwen2.5-1.5B-Instruct") == "Qwen/Qwen2.5-1.5B-Instruct"
    assert registry.resolve_model("minilm").endswith("model")
