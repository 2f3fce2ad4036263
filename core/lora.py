"""LoRA adapters as the engines use them: what an adapter was trained on, its rank, and merging it into its base.

A training run saves a PEFT adapter (``adapter_config.json`` + ``adapter_model.safetensors``). Every engine reads
it through here: :func:`adapter_info` names its base model and rank (checked against an engine's limits before
the engine starts), :func:`merge_adapter` folds it into the base weights (``memreader merge`` and vLLM on a CPU,
where serving an adapter unmerged costs about ten times the decode time), and :func:`merged_model` keeps one
merged copy per adapter and dtype beside it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from memreader.core.engines import DTYPES
from memreader.core.errors import MemReaderError
from memreader.core.paths import models_dir, sha256_file, write_json
from memreader.core.registry import MINILM, SMOLLM2, ModelNotFoundError, canonical_name, resolve_model

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint"
MERGE_DTYPES = (*DTYPES, CHECKPOINT)
"""A merge's dtype: :data:`memreader.core.engines.DTYPES` (``auto`` as every stage means it:
:func:`memreader.core.engines.resolve_engine`, stage ``merge``), or ``checkpoint``, the base checkpoint's own dtype
(the default: a merge writes weights and keeps their precision)."""


class MergeError(MemReaderError, ValueError):
    """The adapter, base or output folder cannot be used; the message says which and how to fix it."""


@dataclass(frozen=True)
class AdapterInfo:
    """What an adapter folder says about itself."""

    path: Path
    base: str  # the base model it was trained on (registry name when a run recorded one)
    rank: int  # LoRA r (the largest, when ranks differ per module)
    weights_sha256: str


def adapter_info(adapter_dir: str | Path) -> AdapterInfo:
    """Base model, rank and weight hash of a PEFT LoRA folder; a clear error when it is not one."""
    adapter = Path(adapter_dir).expanduser().resolve()
    config_path = adapter / "adapter_config.json"
    weights = adapter / "adapter_model.safetensors"
    if not config_path.is_file() or not weights.is_file():
        raise MergeError(f"{adapter} is not a LoRA adapter folder (it needs adapter_config.json and "
                         "adapter_model.safetensors); pass the folder a training run saved its adapter in "
                         "($MEMREADER_HOME/runs/<run>/train)")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    ranks = [int(config.get("r") or 0), *(int(v) for v in (config.get("rank_pattern") or {}).values())]
    return AdapterInfo(path=adapter, base=adapter_base(adapter), rank=max(ranks), weights_sha256=sha256_file(weights))


def same_base(a: str, b: str) -> bool:
    """Whether two model names (registry names, aliases, folders, hub ids) name the same weights; a folder that
    no longer exists is compared by its last path component (an adapter records the folder it was trained from)."""
    def norm(name: str) -> str:
        name = canonical_name(name)
        if name in (SMOLLM2, MINILM) or Path(name).expanduser().exists():
            return str(Path(resolve_model(name)).resolve())
        return name

    na, nb = norm(a), norm(b)
    return na == nb or Path(na).name == Path(nb).name


def adapter_base(adapter_dir: Path) -> str:
    """The base model an adapter was trained on: ``summary.json``'s registry name when the adapter is a
    training run folder, else ``base_model_name_or_path`` from ``adapter_config.json``."""
    summary = adapter_dir / "summary.json"
    if summary.is_file():
        model = json.loads(summary.read_text(encoding="utf-8")).get("model")
        if model:
            return str(model)
    config = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
    base = config.get("base_model_name_or_path")
    if not base:
        raise MergeError(f"{adapter_dir}/adapter_config.json names no base model; set base=MODEL")
    return str(base)


def merge_adapter(adapter_dir: str, output_dir: str | None = None, base: str | None = None, dtype: str = CHECKPOINT,
                  overwrite: bool = False) -> Path:
    """Load ``base`` + the LoRA in ``adapter_dir``, ``merge_and_unload`` and save model + tokenizer to
    ``output_dir`` (default ``<adapter_dir>/merged``) in ``dtype`` (:data:`MERGE_DTYPES`); returns the output
    folder."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter = Path(adapter_dir).expanduser().resolve()
    if not (adapter / "adapter_config.json").is_file():
        raise MergeError(f"{adapter} has no adapter_config.json; pass the folder a training run saved its "
                         "adapter in ($MEMREADER_HOME/runs/<run>/train)")
    if dtype not in MERGE_DTYPES:
        raise MergeError(f"dtype {dtype!r} is not one of {', '.join(MERGE_DTYPES)}")
    out = Path(output_dir).expanduser().resolve() if output_dir else adapter / "merged"
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise MergeError(f"{out} exists and is not empty; choose another output (--set output=FOLDER) or "
                         "set overwrite=true")
    base_name = base or adapter_base(adapter)
    try:
        base_path = resolve_model(base_name)
    except ModelNotFoundError as err:
        raise MergeError(f"base model {base_name!r} of adapter {adapter}: {err}") from err

    start = time.perf_counter()
    if dtype == "auto":
        from memreader.core.engines import resolve_engine

        dtype = resolve_engine("merge", "transformers", "auto").dtype
    torch_dtype = "auto" if dtype == CHECKPOINT else getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch_dtype)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(str(out))
    tokenizer_src = adapter if (adapter / "tokenizer_config.json").is_file() else Path(base_path)
    AutoTokenizer.from_pretrained(str(tokenizer_src)).save_pretrained(str(out))
    seconds = time.perf_counter() - start
    write_json(out / "merge_manifest.json", {"base": base_name, "base_path": base_path, "adapter": str(adapter),
                                              "dtype": str(merged.dtype), "seconds": round(seconds, 2)})
    log.info("merged %s into %s in %.1f s -> %s", adapter, base_name, seconds, out)
    return out


def merged_model(adapter_dir: str | Path, base: str | None = None, dtype: str = CHECKPOINT) -> Path:
    """One merged copy of ``base`` + adapter per adapter weights, base and dtype, built once and reused (written
    aside and renamed, so concurrent processes never see or clobber a half-written copy):
    inside the adapter folder (``merged-<dtype>-<hash>``, so it goes when the adapter goes), or under
    ``$MEMREADER_HOME/models/merged/`` when the adapter folder is read-only."""
    info = adapter_info(adapter_dir)
    base_name = base or info.base
    key = hashlib.sha256(json.dumps([info.weights_sha256, resolve_model(base_name), dtype]).encode()).hexdigest()[:12]
    name = f"merged-{dtype}-{key}"
    writable = os.access(info.path, os.W_OK)
    target = info.path / name if writable else models_dir() / "merged" / name
    if (target / "merge_manifest.json").is_file():
        return target
    # several processes (read-dist workers) may merge at once: each writes its own folder, the first rename wins
    tmp = target.with_name(f"{target.name}.partial-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    merge_adapter(str(info.path), str(tmp), base=base_name, dtype=dtype)
    try:
        tmp.rename(target)
    except OSError:
        if not (target / "merge_manifest.json").is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # another process finished the same merge first
    return target
