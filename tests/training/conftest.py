"""Fixtures for the training tests: one MEMREADER_HOME per session, the embedded SmolLM2 converted once,
and a tiny random Llama (hidden 32, 2 layers) that reuses SmolLM2's tokenizer and chat template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

ASSETS = Path(__file__).parent / "assets"


@pytest.fixture(scope="session")
def training_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MEMREADER_HOME shared by every training test of this session."""
    return tmp_path_factory.mktemp("memreader_home")


@pytest.fixture(autouse=True)
def _memreader_home(training_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # Function-scoped so the variable never leaks into other packages' tests.
    monkeypatch.setenv("MEMREADER_HOME", str(training_home))
    return training_home


@pytest.fixture(scope="session")
def smollm2_path(training_home: Path) -> str:
    """The embedded SmolLM2-135M-Instruct, converted once per session (~30 s)."""
    from memreader.registry import SMOLLM2, resolve_model

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MEMREADER_HOME", str(training_home))
        return resolve_model(SMOLLM2)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, smollm2_path: str) -> str:
    """A random 2-layer Llama with hidden size 32 and the SmolLM2 tokenizer, saved as a model folder."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True,
        # a wide init lets a rank-8 LoRA reshape the logits fast, so the loss visibly falls in a few steps
        initializer_range=0.3,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny_llama")
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture
def tiny_records() -> list[dict[str, Any]]:
    """The 4 records of tests/training/assets/tiny_sft.jsonl."""
    lines = (ASSETS / "tiny_sft.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


@pytest.fixture
def write_jsonl(tmp_path: Path):
    """Write records as ``tmp_path/<name>`` JSONL and return the path."""
    def _write(name: str, records: list[dict[str, Any]]) -> Path:
        path = tmp_path / name
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
        return path
    return _write


@pytest.fixture
def sft_files(tiny_records: list[dict[str, Any]], write_jsonl) -> tuple[Path, Path]:
    """train.jsonl (the 4 asset records repeated 4x with distinct ids) and val.jsonl (the 4 originals)."""
    repeated = [{**r, "id": f"{r['id']}-{k}"} for k in range(4) for r in tiny_records]
    return write_jsonl("train.jsonl", repeated), write_jsonl("val.jsonl", tiny_records)
