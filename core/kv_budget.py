"""How many tokens of KV cache an engine can hold, so that a batch setting is checked against memory, not found out
by an out-of-memory crash: :func:`check_kv_cache_gib` (vLLM, before the engine starts) and
:func:`local_kv_capacity_tokens` (transformers: half the free memory at :func:`kv_bytes_per_token`).
Details: docs/ENGINES.md (Reading keeps the engine full: Memory, not only ``batch_size``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memreader.core.errors import ConfigError

GiB = 2**30
LOCAL_SHARE = 0.5  # of the free memory, for a transformers model's KV cache (activations and the rest need room too)
ENGINE_SHARE = 0.8  # of the free memory, the most a vLLM CPU engine's KV cache may take


def free_memory_bytes() -> int:
    """Memory this machine can give now (``MemAvailable``; psutil where /proc is not there)."""
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    import psutil

    return int(psutil.virtual_memory().available)


def check_kv_cache_gib(gib: float, free: int | None = None) -> None:
    """Refuse a vLLM CPU cache that would take more than :data:`ENGINE_SHARE` of the free memory (the engine would
    be killed by the kernel mid-run, not refused), naming the setting, the measured free memory and the fix."""
    free = free_memory_bytes() if free is None else free
    if gib * GiB > ENGINE_SHARE * free:
        raise ConfigError(f"kv_cache_gib: {gib:g} GiB of KV cache is more than this machine can give: "
                          f"{free / GiB:.1f} GiB free now, of which at most {ENGINE_SHARE:.0%} "
                          f"({ENGINE_SHARE * free / GiB:.1f} GiB) goes to the cache; set kv_cache_gib="
                          f"{max(0.25, int(4 * ENGINE_SHARE * free / GiB) / 4):g} or less (a smaller batch_size "
                          "needs less), or free memory")


def kv_bytes_per_token(config: Any, dtype_bytes: int) -> int:
    """Bytes one token takes in the KV cache of a decoder with transformers ``config`` (keys and values of every
    layer)."""
    heads = getattr(config, "num_attention_heads", 1)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * dtype_bytes


def local_kv_capacity_tokens(model: Any, free: int | None = None) -> int:
    """Tokens of KV cache :data:`LOCAL_SHARE` of the free memory (the GPU's for a model on one) holds for a loaded
    transformers ``model``."""
    param = next(model.parameters())
    if free is None:
        if param.device.type == "cuda":
            import torch

            free = int(torch.cuda.mem_get_info(param.device)[0])
        else:
            free = free_memory_bytes()
    per_token = kv_bytes_per_token(model.config, param.element_size())
    return int(LOCAL_SHARE * free // per_token)
