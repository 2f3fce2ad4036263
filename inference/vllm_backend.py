"""vLLM generation backend (GPU extra: ``pip install -e .[gpu]``), same interface as the teacher backends.

    memreader read --config configs/inference/qwen2_5_7b_vllm.yaml --set adapter=<run>/train/adapter

vLLM is imported only when this backend is built, so CPU installs never need it. The LoRA adapter
is applied per request with ``LoRARequest`` (the base weights stay shared), which is also what
``vllm serve <base> --enable-lora --lora-modules memreader=<adapter>`` does for the HTTP path.
"""

from __future__ import annotations

import time
from typing import Any

from memreader.registry import resolve_model


class VLLMBackend:
    """Offline batched chat generation with vLLM, optionally through a LoRA adapter."""

    def __init__(
        self,
        model: str,
        adapter: str | None = None,
        max_model_len: int = 8192,
        max_lora_rank: int = 64,
        gpu_memory_utilization: float = 0.9,
        tensor_parallel_size: int = 1,
    ) -> None:
        try:
            from vllm import LLM
            from vllm.lora.request import LoRARequest
        except ImportError as exc:  # the message names the fix; the original error stays chained
            raise ImportError(
                "backend=vllm needs the GPU extra: pip install -e '.[gpu]' (CUDA machine); "
                "on CPU use backend=transformers"
            ) from exc
        self.llm = LLM(
            model=resolve_model(model),
            enable_lora=adapter is not None,
            max_lora_rank=max_lora_rank,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
        )
        self.lora = LoRARequest("memreader", 1, adapter) if adapter else None

    def generate_many(
        self, messages_list: list[list[dict[str, str]]], params: Any, progress_desc: str | None = None,
        on_reply: Any = None, return_exceptions: bool = False,
    ) -> list[str]:
        """One reply per conversation, in input order (vLLM batches internally; ``on_reply`` is
        called for each reply once the batch returns; there are no per-request failures to return)."""
        from vllm import SamplingParams

        sampling = SamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            repetition_penalty=params.repetition_penalty,
            seed=params.seed,
        )
        t0 = time.perf_counter()
        outs = self.llm.chat(messages_list, sampling, lora_request=self.lora, use_tqdm=progress_desc is not None)
        texts = [o.outputs[0].text for o in outs]
        for i, text in enumerate(texts):
            if on_reply is not None:
                on_reply(i, text)
        n_tok = sum(len(o.outputs[0].token_ids) for o in outs)
        dt = time.perf_counter() - t0
        print(f"vllm: {len(texts)} replies, {n_tok} tokens in {dt:.1f}s ({n_tok / max(dt, 1e-9):.0f} tok/s)")
        return texts
