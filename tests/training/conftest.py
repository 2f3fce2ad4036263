"""Fixtures for the training tests (the session home, SmolLM2 and the tiny random Llama live in
tests/conftest.py; here the cut scorer's tiny Llamas of two hidden sizes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

ASSETS = Path(__file__).parent / "assets"


@pytest.fixture(scope="session")
def training_home(memreader_home: Path) -> Path:
    """The MEMREADER_HOME shared by every test of this session (see tests/conftest.py)."""
    return memreader_home


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


def _tiny_llama(tokenizer: Any, folder: Path, hidden: int) -> str:
    """A random 2-layer Llama of hidden size ``hidden`` on ``tokenizer``, saved with it (as tests/conftest.py's
    tiny_model, without converting SmolLM2 for its tokenizer)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def torch_one_thread() -> Any:
    """Torch on one thread for a module (two threads on a busy 2-core machine run several times slower); the
    session's setting is put back after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_llamas(smollm2_tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """{hidden size: model folder} of the cut scorer's tests, for hidden sizes 32 and 48."""
    return {h: _tiny_llama(smollm2_tokenizer, tmp_path_factory.mktemp(f"tiny_llama_{h}"), h) for h in (32, 48)}


@pytest.fixture(scope="module")
def features(tiny_llamas: dict[int, str]) -> Any:
    """The cut features of the hidden-size-32 tiny Llama's first layer."""
    from memreader.core.cut_features import CutFeatures

    return CutFeatures.load(tiny_llamas[32], layers=1)
