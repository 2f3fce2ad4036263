"""vLLM offline generation (GPU extra: ``pip install -e .[gpu]``), guided through llguidance.

    memreader read --config configs/inference/qwen2_5_7b_vllm.yaml --set adapter=<run>/train/adapter

Targets vLLM >= 0.12 (the ``structured_outputs`` API; the older ``guided_*`` fields were removed
in 0.12). vLLM is imported only when this backend is built, so CPU installs never need it. The
structured-output backend is named explicitly as ``guidance`` (llguidance): the automatic choice
may pick xgrammar, which cannot take our lark grammars. A LoRA adapter is applied per request with
``LoRARequest`` (the base weights stay shared), as ``vllm serve --enable-lora`` does for HTTP.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from memreader.generation.params import GenerationParams, Messages, OnReply, Reply
from memreader.registry import resolve_model


class VLLMChat:
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
            structured_outputs_config={"backend": "guidance"},
        )
        self.lora = LoRARequest("memreader", 1, adapter) if adapter else None

    def tokenizer(self) -> Any:
        """The engine's tokenizer (for token counts when sizing grammars)."""
        return self.llm.get_tokenizer()

    def generate_many(
        self, messages_list: Sequence[Messages], params: GenerationParams, progress_desc: str | None = None,
        on_reply: OnReply | None = None, return_exceptions: bool = False,
        grammars: Sequence[str | None] | None = None, seeds: Sequence[int | None] | None = None,
    ) -> list[Reply]:
        """One reply per conversation, in input order (vLLM batches internally; ``on_reply`` is
        called for each reply once the batch returns; there are no per-request failures to return).
        ``seeds[i]`` (default ``params.seed``) seeds request ``i`` on its own (vLLM's per-request
        generator), so a reply does not depend on its batch."""
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        def sampling(grammar: str | None, seed: int | None) -> Any:
            return SamplingParams(
                temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_new_tokens,
                repetition_penalty=params.repetition_penalty, seed=seed,
                structured_outputs=StructuredOutputsParams(grammar=grammar) if grammar is not None else None)

        rows = list(grammars) if grammars is not None else [None] * len(messages_list)
        row_seeds = list(seeds) if seeds is not None else [params.seed] * len(messages_list)
        t0 = time.perf_counter()
        outs = self.llm.chat(list(messages_list), [sampling(g, s) for g, s in zip(rows, row_seeds, strict=True)],
                             lora_request=self.lora,
                             use_tqdm=progress_desc is not None)
        replies = []
        for i, (o, g) in enumerate(zip(outs, rows, strict=True)):
            c = o.outputs[0]
            reply = Reply(c.text, finish_reason=c.finish_reason, prompt_tokens=len(o.prompt_token_ids or []),
                          completion_tokens=len(c.token_ids), guided=g is not None)
            replies.append(reply)
            if on_reply is not None:
                on_reply(i, reply)
        n_tok = sum(r.completion_tokens or 0 for r in replies)
        dt = time.perf_counter() - t0
        print(f"vllm: {len(replies)} replies, {n_tok} tokens in {dt:.1f}s ({n_tok / max(dt, 1e-9):.0f} tok/s)")
        return replies
