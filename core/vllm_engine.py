"""vLLM engines: one per process and model, shared by every stage that asks for ``backend: vllm``.

:func:`get_engine` keeps each engine it built for the life of the process (20-95 s to start on a CPU), so the reader,
teacher, scorer, answering and support share one when they name the same model, dtype and limits. vLLM is imported
only here and only when an engine is asked for. Details (dtype, ``lora_mode``, CPU in-process eager, guided
decoding): docs/ENGINES.md (vLLM here and on a GPU).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

from memreader.core.config import ConfigError
from memreader.core.engines import (  # noqa: F401  (vLLM's import check lives with the engine rule; named here too)
    DTYPES,
    VLLMUnavailable,
    device_dtype,
    engine_logging,
    import_vllm,
)
from memreader.core.errors import MemReaderError
from memreader.core.registry import resolve_model

log = logging.getLogger(__name__)
engine_logging()  # before anything imports vLLM (core.engines.engine_logging)

LORA_MODES = ("auto", "merge", "request")
COMPILE_MODES = ("auto", "eager", "compiled")
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts


class PromptTooLong(MemReaderError, ValueError):
    """A prompt does not fit the engine's ``max_model_len`` (refused per request; the message names the fix)."""


def on_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@dataclass(frozen=True)
class EngineSpec:
    """Everything that shapes an engine (hashable: the process-wide engine cache is keyed by it)."""

    model: str
    dtype: str = "auto"
    adapter: str = ""
    lora_mode: str = "auto"
    max_model_len: int = 8192
    max_lora_rank: int = 64
    kv_cache_gib: float = 2.0  # GiB on a CPU: room for the reader's 32 requests in flight
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    seed: int = 0
    compile_mode: str = "auto"
    prefix_caching: bool = True  # vLLM's automatic prefix caching (off only to measure raw prefill)

    def problems(self) -> list[str]:
        out = []
        if self.dtype not in DTYPES:
            out.append(f"dtype: {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.lora_mode not in LORA_MODES:
            out.append(f"lora_mode: {self.lora_mode!r} is not one of {', '.join(LORA_MODES)}")
        if self.max_model_len < 16:
            out.append(f"max_model_len: {self.max_model_len} is too small (a prompt needs room)")
        if self.compile_mode not in COMPILE_MODES:
            out.append(f"compile_mode: {self.compile_mode!r} is not one of {', '.join(COMPILE_MODES)}")
        if self.max_lora_rank not in LORA_RANKS:
            out.append(f"max_lora_rank: {self.max_lora_rank} is not one vLLM takes ({', '.join(map(str, LORA_RANKS))})")
        if self.kv_cache_gib <= 0:
            out.append(f"kv_cache_gib: {self.kv_cache_gib} must be > 0")
        return out


class Engine:
    """One started vLLM ``LLM`` plus what it was started with (see :func:`get_engine`)."""

    def __init__(self, spec: EngineSpec, llm: Any, model_path: str, dtype: str, lora_mode: str, lora: Any,
                 startup_s: float) -> None:
        self.spec, self.llm, self.model_path, self.dtype = spec, llm, model_path, dtype
        self.lora_mode, self.lora, self.startup_s = lora_mode, lora, startup_s
        self.max_model_len = spec.max_model_len
        self._tokenizer: Any = None

    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = self.llm.get_tokenizer()
        return self._tokenizer

    def describe(self) -> dict[str, Any]:
        """What produced a result: recorded in every run's summary."""
        vllm = import_vllm()
        return {"backend": "vllm", "vllm": vllm.__version__, "device": "cuda" if on_gpu() else "cpu",
                "dtype": self.dtype, "model": self.spec.model, "adapter": self.spec.adapter or None,
                "lora_mode": self.lora_mode if self.spec.adapter else None, "max_model_len": self.max_model_len,
                "startup_s": round(self.startup_s, 1)}

    def prefix_cache_tokens(self) -> int:
        """Tokens the engine's KV cache holds when automatic prefix caching is on; 0 when it is off, so that a
        caller planning on cache hits does not."""
        return self.kv_capacity_tokens() if self.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching else 0

    def kv_capacity_tokens(self) -> int:
        """Tokens the engine's KV cache holds (its blocks times their size)."""
        cache = self.llm.llm_engine.vllm_config.cache_config
        return int(cache.num_gpu_blocks or 0) * int(cache.block_size)

    def check_prompt(self, n_tokens: int, what: str = "prompt") -> None:
        """Refuse a prompt that leaves no room to generate under ``max_model_len``."""
        if n_tokens >= self.max_model_len:
            raise PromptTooLong(
                f"{what} has {n_tokens} tokens, which does not fit max_model_len={self.max_model_len}",
                "raise max_model_len (up to the model's context), or read long documents in windows "
                "(window_tokens=..., see docs/ARCHITECTURE.md)")


_ENGINES: dict[EngineSpec, Engine] = {}


def _cpu_in_process(kwargs: dict[str, Any]) -> None:
    """vLLM's CPU build, run the way that measured fastest on small machines (see the module docstring): the
    engine core and its one worker in this process, on every core torch has here."""
    from memreader.core.hardware import use_cpu_threads

    if kwargs.get("tensor_parallel_size", 1) == 1:
        kwargs["distributed_executor_backend"] = "uni"
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # vLLM drops torch to one thread "for serving" unless OMP_NUM_THREADS is set; give it this process's threads
    os.environ.setdefault("OMP_NUM_THREADS", str(use_cpu_threads()))
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")


def _check_adapter(spec: EngineSpec, lora_mode: str) -> None:
    from memreader.core.lora import MergeError, adapter_info, same_base

    try:
        info = adapter_info(spec.adapter)
    except MergeError as exc:
        raise ConfigError(f"adapter: {exc}") from None
    if not same_base(info.base, spec.model):
        raise ConfigError(f"adapter: {info.path} was trained on {info.base!r}, but the engine's model is "
                          f"{spec.model!r}; set model={info.base} or pass an adapter trained on {spec.model}")
    if lora_mode == "request" and info.rank > spec.max_lora_rank:
        fits = next((r for r in LORA_RANKS if r >= info.rank), None)
        raise ConfigError(f"adapter: {info.path} has LoRA rank {info.rank}, above max_lora_rank="
                          f"{spec.max_lora_rank}; set max_lora_rank={fits} (or more), or lora_mode=merge")


def get_engine(spec: EngineSpec) -> Engine:
    """The process's engine for ``spec``, started on first use (checks first, so a bad adapter or setting
    fails in a second, not after the engine's start-up)."""
    problems = spec.problems()
    if problems:
        raise ConfigError("vllm engine: " + "; ".join(problems))
    vllm = import_vllm()
    gpu = on_gpu()
    # auto settings resolved first, so "auto" and what it resolves to share one engine
    lora_mode = spec.lora_mode if spec.lora_mode != "auto" else ("request" if gpu else "merge")
    dtype = spec.dtype if spec.dtype != "auto" else device_dtype("cuda" if gpu else "cpu")[0]
    spec = replace(spec, dtype=dtype, lora_mode=lora_mode if spec.adapter else "auto")
    if spec in _ENGINES:
        return _ENGINES[spec]
    model_path = resolve_model(spec.model)
    if spec.adapter:
        _check_adapter(spec, lora_mode)
    if spec.adapter and lora_mode == "merge":
        from memreader.core.lora import merged_model

        model_path = str(merged_model(spec.adapter, base=spec.model, dtype=dtype))
    kwargs: dict[str, Any] = {
        "model": model_path, "dtype": dtype, "max_model_len": spec.max_model_len, "seed": spec.seed,
        "tensor_parallel_size": spec.tensor_parallel_size, "structured_outputs_config": {"backend": "guidance"},
        "enable_lora": bool(spec.adapter) and lora_mode == "request",
        "enable_prefix_caching": spec.prefix_caching,
    }
    if kwargs["enable_lora"]:
        kwargs["max_lora_rank"] = spec.max_lora_rank
    kwargs["enforce_eager"] = spec.compile_mode == "eager" or (spec.compile_mode == "auto" and not gpu)
    if gpu:
        kwargs["gpu_memory_utilization"] = spec.gpu_memory_utilization
    else:
        from memreader.core.kv_budget import check_kv_cache_gib

        check_kv_cache_gib(spec.kv_cache_gib)  # before the engine allocates it
        kwargs["kv_cache_memory_bytes"] = int(spec.kv_cache_gib * 2**30)
        # no chunked prefill on a CPU: vLLM rewinds a seeded request's generator after a partial prefill, which a
        # CPU generator cannot do ("CPU Generator does not use offset"): every long batch with seeds crashed
        kwargs["enable_chunked_prefill"] = False
        kwargs["max_num_batched_tokens"] = max(spec.max_model_len, 8192)
        _cpu_in_process(kwargs)
    log.info("starting a vLLM engine: %s", {k: v for k, v in kwargs.items() if k != "structured_outputs_config"})
    t0 = time.perf_counter()
    llm = vllm.LLM(**kwargs)
    startup = time.perf_counter() - t0
    lora = None
    if kwargs["enable_lora"]:
        from vllm.lora.request import LoRARequest

        lora = LoRARequest("memreader", 1, str(spec.adapter))
    engine = Engine(spec, llm, model_path, dtype, lora_mode, lora, startup)
    print(f"vllm: engine for {spec.model} ({dtype}, {'cuda' if gpu else 'cpu'}"
          f"{', adapter ' + lora_mode + 'd' if spec.adapter else ''}) started in {startup:.1f} s", file=sys.stderr)
    _ENGINES[spec] = engine
    return engine


def shutdown_engines() -> None:
    """Stop every engine this process started (tests; a long-lived process that is done with vLLM)."""
    import gc

    for engine in list(_ENGINES.values()):
        core = getattr(getattr(engine.llm, "llm_engine", None), "engine_core", None)
        if core is not None and callable(getattr(core, "shutdown", None)):
            core.shutdown()
    _ENGINES.clear()
    gc.collect()


def prompt_nlls(engine: Engine, sequences: Any) -> list[Any]:
    """Per-token ``-log p`` of ``ids[start:]`` for each ``(ids, start)`` through vLLM ``prompt_logprobs``
    (one generated token each, which is discarded; through the engine's adapter when it applies one per request):
    the vLLM twin of :class:`memreader.core.scoring_engines.TokenNLL`.
    vLLM takes the log-softmax of the raw logits over the full vocabulary. A request with ``prompt_logprobs`` does
    not read the prefix cache, so each sequence is prefilled whole: measured on vLLM 0.32 CPU, forcing the read
    (``skip_reading_prefix_cache=False``) returns uninitialised entries for the cached positions (token ids like
    1701869940, which can crash vLLM's detokeniser) and tail values up to 0.17 nats off the full pass."""
    import numpy as np
    from vllm import SamplingParams

    for i, (ids, start) in enumerate(sequences):
        if start < 1 or start > len(ids):
            raise ValueError(f"sequence {i}: scored span starts at {start}, outside 1..{len(ids)}")
        engine.check_prompt(len(ids), f"sequence {i}")
    if not sequences:
        return []
    outs = engine.llm.generate([{"prompt_token_ids": list(ids)} for ids, _ in sequences],
                               SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False,
                               lora_request=engine.lora)
    return [np.array([-float(out.prompt_logprobs[p][ids[p]].logprob) for p in range(start, len(ids))], dtype=np.float64)
            for (ids, start), out in zip(sequences, outs, strict=True)]
