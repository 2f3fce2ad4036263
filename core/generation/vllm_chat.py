"""vLLM offline generation (CPU build via ``make setup``, upstream vLLM via ``.[gpu]``), guided through llguidance.

    memreader read --config configs/demo/read.yaml --set backend=vllm

Targets vLLM >= 0.12 (the ``structured_outputs`` API), on the process's shared engine (:mod:`memreader.core.vllm_engine`:
sharing, adapters, the CPU setup). Requests are checked one by one before the batch goes in: a prompt that does not fit
``max_model_len`` or a grammar llguidance cannot compile fails that request alone (``return_exceptions``), named.
:meth:`VLLMChat.stream` feeds the running engine request by request instead (what the reader uses).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from memreader.core.generation.params import (
    BatchChat,
    GenerationParams,
    GenerationRequestError,
    Messages,
    Reply,
    check_messages,
)
from memreader.core.generation.stream import StreamRequest
from memreader.core.vllm_engine import Engine, EngineSpec, get_engine


class VLLMChat(BatchChat):
    """Batched chat generation with a shared vLLM engine, optionally through a LoRA adapter."""

    LOG_NAME = "vllm"

    def __init__(self, model: str, adapter: str | None = None, max_model_len: int = 8192, max_lora_rank: int = 64,
                 gpu_memory_utilization: float = 0.9, tensor_parallel_size: int = 1, dtype: str = "auto",
                 lora_mode: str = "auto", kv_cache_gib: float = 2.0, compile_mode: str = "auto",
                 prefix_caching: bool = True, engine: Engine | None = None) -> None:
        self.model_name = model
        self.spec = EngineSpec(model=model, dtype=dtype, adapter=adapter or "", lora_mode=lora_mode,
                               max_model_len=max_model_len, max_lora_rank=max_lora_rank, kv_cache_gib=kv_cache_gib,
                               gpu_memory_utilization=gpu_memory_utilization,
                               tensor_parallel_size=tensor_parallel_size, compile_mode=compile_mode,
                               prefix_caching=prefix_caching)
        self.engine = engine or get_engine(self.spec)
        self.llm = self.engine.llm
        self.lora = self.engine.lora

    def __repr__(self) -> str:
        return f"VLLMChat(model={self.model_name!r}, adapter={self.spec.adapter or None!r}, dtype={self.engine.dtype!r})"

    def tokenizer(self) -> Any:
        """The engine's tokenizer (token counts when sizing grammars and windows)."""
        return self.engine.tokenizer()

    def model_window(self) -> int:
        """The engine's context length."""
        return self.engine.max_model_len

    def describe(self) -> dict[str, Any]:
        return self.engine.describe()

    def prefix_cache_tokens(self) -> int:
        """What the engine's prefix cache holds, in tokens (0: no prefix caching)."""
        return self.engine.prefix_cache_tokens()

    def kv_capacity_tokens(self) -> int:
        """Tokens the engine's KV cache holds."""
        return self.engine.kv_capacity_tokens()

    def _request_error(self, messages: Messages, grammar: str | None, params: GenerationParams) -> Exception | None:
        n = self.prompt_tokens(messages)
        if n + 1 > self.engine.max_model_len:
            return GenerationRequestError(
                f"the prompt has {n} tokens and does not fit the vLLM engine's max_model_len="
                f"{self.engine.max_model_len} — fix: raise max_model_len, or read in windows (window_tokens)")
        if n + params.max_new_tokens > self.engine.max_model_len:
            return GenerationRequestError(
                f"the prompt has {n} tokens; with max_new_tokens={params.max_new_tokens} it exceeds max_model_len="
                f"{self.engine.max_model_len} — fix: raise max_model_len, lower max_new_tokens, or read in windows")
        if grammar is not None:
            from memreader.core.generation.guided import compile_matcher, ll_tokenizer

            try:
                compile_matcher(ll_tokenizer(self.tokenizer()), grammar)
            except ValueError as exc:
                return GenerationRequestError(f"the engine cannot compile this request's grammar: {exc}")
        return None

    def _replies(self, messages_list: Sequence[Messages], todo: list[int], params: GenerationParams,
                 grammars: list[str | None], seeds: list[int | None],
                 progress_desc: str | None) -> Iterator[tuple[int, Reply]]:
        """The whole batch through vLLM, which schedules it itself: the replies arrive once it returns."""
        outs = self.llm.chat([list(messages_list[i]) for i in todo],
                             [_sampling(params, grammars[i], seeds[i]) for i in todo],
                             lora_request=self.lora, use_tqdm=progress_desc is not None) if todo else []
        return ((i, _reply(o, grammars[i] is not None)) for i, o in zip(todo, outs, strict=True))

    def stream(self, window: int) -> VLLMStream:
        """A stream into the running engine (:mod:`memreader.core.generation.stream`): up to ``window`` requests in
        it at once, each leaving it the step it finishes."""
        return VLLMStream(self, window)


def _sampling(params: GenerationParams, grammar: str | None, seed: int | None) -> Any:
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    return SamplingParams(temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_new_tokens,
                          repetition_penalty=params.repetition_penalty, seed=seed,
                          structured_outputs=StructuredOutputsParams(grammar=grammar) if grammar is not None else None)


def _reply(output: Any, guided: bool) -> Reply:
    c = output.outputs[0]
    return Reply(c.text, finish_reason=c.finish_reason, prompt_tokens=len(output.prompt_token_ids or []),
                 completion_tokens=len(c.token_ids), guided=guided, cached_tokens=getattr(output, "num_cached_tokens",
                                                                                          None))


class VLLMStream:
    """Requests enter the running vLLM engine as they are submitted and leave it the step they finish, so the
    engine's batch stays full across a whole corpus (vLLM schedules them; a request whose grammar is still
    compiling waits in the engine's queue while the others decode). A request that cannot run is refused on
    submit, as in :meth:`VLLMChat.generate_many`, and handed back as its error by the next :meth:`step`."""

    def __init__(self, chat: VLLMChat, window: int) -> None:
        if window < 1:
            raise ValueError(f"window={window} must be >= 1")
        engine = chat.llm.llm_engine
        if engine.has_unfinished_requests():
            raise RuntimeError("the vLLM engine still runs requests of another caller; a stream needs it to itself")
        self.chat, self.window, self._engine = chat, window, engine
        self._running: dict[str, tuple[Any, bool, str]] = {}  # request id → (tag, guided, vLLM's internal id)
        self._refused: list[tuple[Any, Any]] = []

    @property
    def pending(self) -> int:
        return len(self._running) + len(self._refused)

    def submit(self, request: StreamRequest) -> None:
        check_messages(request.messages)
        error = self.chat._request_error(request.messages, request.grammar, request.params)
        if error is not None:
            self._refused.append((request.tag, error))
            return
        seed = request.seed if request.seed is not None else request.params.seed
        (rid,) = self.chat.llm.enqueue_chat([list(request.messages)], [_sampling(request.params, request.grammar, seed)],
                                            lora_request=self.chat.lora, use_tqdm=False)
        external = rid if rid.isdigit() else rid.rsplit("-", 1)[0]  # vLLM's internal id: "<id>-<8 random chars>"
        self._running[external] = (request.tag, request.grammar is not None, rid)

    def step(self) -> list[tuple[Any, Any]]:
        done, self._refused = self._refused, []
        while self._running and not done:
            for output in self._engine.step():
                if not output.finished:
                    continue
                if output.request_id not in self._running:
                    raise RuntimeError(f"the vLLM engine finished request {output.request_id!r}, which this stream did "
                                       "not submit: another caller shares the engine")
                tag, guided, _ = self._running.pop(output.request_id)
                done.append((tag, _reply(output, guided)))
        return done

    def close(self) -> None:
        if self._running:
            self._engine.abort_request([internal for _, _, internal in self._running.values()], internal=True)
        self._running.clear()
        self._refused.clear()
