"""In-process generation with transformers (the embedded SmolLM2 by default), guided or free.

    chat = LocalChat("smollm2-135m-instruct", batch_size=8)
    replies = chat.generate_many(messages_list, GenerationParams(temperature=0), grammars=[lark, ...])

Prompts are batched (left padding, grouped by length); a row with a grammar is decoded through
:class:`memreader.core.generation.guided.GuidedLogitsProcessor`, a row without one is free.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from memreader.core.generation.params import (
    BatchChat,
    GenerationParams,
    GenerationRequestError,
    Messages,
    Reply,
)
from memreader.core.registry import SMOLLM2


@dataclass
class ChatGeneration:
    """One locally generated chat reply with its token accounting."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" (an end token) or "length" (max_new_tokens reached)
    guided: bool = False


def generate_chat_batch(model: Any, tokenizer: Any, batch: Sequence[Messages], params: GenerationParams,
                        grammars: Sequence[str | None] | None = None,
                        stop_event: threading.Event | None = None,
                        seeds: Sequence[int | None] | None = None) -> list[ChatGeneration]:
    """Left-padded batched generation through the tokenizer's chat template (greedy when temperature == 0).

    ``grammars[i]`` (lark, or None) constrains row ``i``; a guided row whose grammar is not complete
    when the budget runs out is ``"length"``. ``stop_event``, once set, ends generation early
    (a server whose client went away); the rows are then ``"length"``. Sampling: row ``i`` draws
    from its own generator seeded by :func:`~memreader.core.generation.sampling.row_seed` of
    ``seeds[i]`` (default ``params.seed``) and its messages, so its reply does not depend on the
    other rows of the batch; a row without a seed is unseeded.
    """
    import torch
    from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

    prompts = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in batch]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side = side
    enc = enc.to(next(model.parameters()).device)
    eos = model.generation_config.eos_token_id
    eos_ids = {t for t in [*(eos if isinstance(eos, list) else [eos]), tokenizer.eos_token_id] if t is not None}
    kwargs: dict[str, Any] = {"max_new_tokens": params.max_new_tokens, "repetition_penalty": params.repetition_penalty,
                              "pad_token_id": tokenizer.pad_token_id, "eos_token_id": sorted(eos_ids)}
    processor = None
    if grammars is not None and any(g is not None for g in grammars):
        from memreader.core.generation.guided import GuidedLogitsProcessor

        processor = GuidedLogitsProcessor(tokenizer, grammars, sorted(eos_ids))
        kwargs["logits_processor"] = LogitsProcessorList([processor])
    if stop_event is not None:
        class _Stop(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kw: Any) -> Any:
                return torch.full((input_ids.shape[0],), stop_event.is_set(), dtype=torch.bool)

        kwargs["stopping_criteria"] = StoppingCriteriaList([_Stop()])
    # Greedy for temperature 0; otherwise the per-row SeededSampler draws the token (last processor)
    # and generate's greedy step takes it: OpenAI semantics, no top-k cut whatever generation_config says.
    kwargs["do_sample"] = False
    if params.temperature > 0:
        from memreader.core.generation.sampling import SeededSampler, row_seed

        row_seeds = list(seeds) if seeds is not None else [params.seed] * len(batch)
        sampler = SeededSampler([None if s is None else row_seed(s, m) for s, m in zip(row_seeds, batch, strict=True)],
                                params.temperature, params.top_p)
        kwargs["logits_processor"] = LogitsProcessorList([p for p in (processor, sampler) if p is not None])
    with torch.inference_mode():
        out = model.generate(**enc, **kwargs)
    new = out[:, enc["input_ids"].shape[1]:].tolist()
    results = []
    for r, (row, prompt_len) in enumerate(zip(new, enc["attention_mask"].sum(dim=1).tolist(), strict=True)):
        stop = next((i for i, t in enumerate(row) if t in eos_ids), None)
        kept = row if stop is None else row[: stop + 1]
        guided = processor is not None and processor.matchers[r] is not None
        finished = stop is not None and (not guided or processor.complete(r))
        results.append(ChatGeneration(tokenizer.decode(kept, skip_special_tokens=True), int(prompt_len), len(kept),
                                      "stop" if finished else "length", guided))
    return results


class LocalChat(BatchChat):
    """In-process transformers generation (the embedded SmolLM2 by default); loads on first use. The weights are
    the process's shared copy (:func:`memreader.core.runtime.shared_causal_lm`): another stage naming the same
    model, adapter, dtype and device uses the same ones."""

    LOG_NAME = "local"

    def __init__(self, model: str = SMOLLM2, device: str = "auto", batch_size: int = 4,
                 adapter: str | None = None, dtype: str = "auto") -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        self.model_name, self.device, self.batch_size, self.adapter = model, device, batch_size, adapter
        self.dtype = dtype  # auto: the device's rule (memreader.core.engines.device_dtype)
        self._model: Any = None
        self._tokenizer: Any = None
        self._lock = threading.Lock()  # one generate() at a time (the shared model's lock once loaded)

    def __repr__(self) -> str:
        return f"LocalChat(model={self.model_name!r}, device={self.device!r}, batch_size={self.batch_size})"

    def tokenizer(self) -> Any:
        """The model's tokenizer (loads the model on first use)."""
        self._load()
        return self._tokenizer

    def model(self) -> Any:
        """The loaded model (loads it on first use), e.g. to share its weights with the evaluator."""
        self._load()
        return self._model

    def describe(self) -> dict[str, Any]:
        """What produced a result (the loaded model's device and dtype), for run summaries."""
        param = next(self.model().parameters())
        return {"backend": "transformers", "device": param.device.type, "model": self.model_name,
                "adapter": self.adapter, "dtype": str(param.dtype).replace("torch.", "")}

    def model_window(self) -> int | None:
        """The model's context length (``max_position_embeddings``), None when its config has none."""
        return getattr(self.model().config, "max_position_embeddings", None) or None

    def kv_capacity_tokens(self) -> int:
        """Tokens of KV cache half of the model device's free memory holds now
        (:func:`memreader.core.kv_budget.local_kv_capacity_tokens`)."""
        from memreader.core.kv_budget import local_kv_capacity_tokens

        return local_kv_capacity_tokens(self.model())

    def _load(self) -> None:
        if self._model is not None:
            return
        from memreader.core.runtime import runtime, shared_causal_lm

        shared = shared_causal_lm(self.model_name, adapter=self.adapter, rt=runtime(self.device, self.dtype))
        self._model, self._tokenizer, self._lock = shared.model, shared.tokenizer, shared.lock

    def _generate(self, batch: Sequence[Messages], params: GenerationParams,
                  grammars: Sequence[str | None] | None = None,
                  seeds: Sequence[int | None] | None = None) -> list[Reply]:
        self._load()
        with self._lock:
            gens = generate_chat_batch(self._model, self._tokenizer, batch, params, grammars, seeds=seeds)
        return [Reply(g.text, finish_reason=g.finish_reason, prompt_tokens=g.prompt_tokens,
                      completion_tokens=g.completion_tokens, guided=g.guided) for g in gens]

    def _replies(self, messages_list: Sequence[Messages], todo: list[int], params: GenerationParams,
                 grammars: list[str | None], seeds: list[int | None],
                 progress_desc: str | None) -> Iterator[tuple[int, Reply]]:
        """Batches of ``batch_size`` prompts grouped by length to cut padding; ``seeds[i]`` seeds prompt ``i``'s own
        sampler, so the same prompt and seed give the same reply whatever its batch."""
        order = sorted(todo, key=lambda i: len(str(messages_list[i])))
        # No description: the caller shows its own progress (reader batches), so no second bar.
        with tqdm(total=len(order), desc=progress_desc, unit="reply", disable=progress_desc is None) as bar:
            for lo in range(0, len(order), self.batch_size):
                idx = order[lo: lo + self.batch_size]
                outs = self._generate([messages_list[i] for i in idx], params, [grammars[i] for i in idx],
                                      [seeds[i] for i in idx])
                yield from zip(idx, outs, strict=True)
                bar.update(len(idx))

    def _request_error(self, messages: Messages, grammar: str | None, params: GenerationParams) -> Exception | None:
        """A prompt that with ``max_new_tokens`` would not fit the model's window, as a request error."""
        window = self.model_window()
        n = self.prompt_tokens(messages) if window else 0
        if not window or n + params.max_new_tokens <= window:
            return None
        return GenerationRequestError(
            f"the prompt has {n} tokens; with max_new_tokens={params.max_new_tokens} it exceeds the model's "
            f"window of {window} tokens — fix: split the document into windows (window_tokens: 0 sizes "
            "them to the model, a set value must be lower) or lower max_new_tokens")
