"""Teacher clients for data generation: any OpenAI-compatible endpoint, or an in-process model.

    from data_gen.teacher import GenerationParams, make_teacher
    teacher = make_teacher("openai", model="deepseek-reasoner", base_url="https://api.deepseek.com/v1")
    texts = teacher.generate_many([[{"role": "user", "content": "hi"}]], GenerationParams(seed=0))

Both backends return :class:`TeacherReply` objects: ``str`` subclasses holding the message content,
so callers that only want text use them as strings (and JSON-dump them as strings). A reasoning
model's separate ``reasoning_content`` (DeepSeek-R1 style) is kept out of the text, on
``reply.reasoning``; ``reply.with_think()`` gives ``<think>reasoning</think>\\ncontent`` when wanted.
Content that itself contains ``<think>`` is returned verbatim (MemReader's CoM output uses it).
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import os
import random
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from tqdm.auto import tqdm

from memreader.config import field

log = logging.getLogger(__name__)

Messages = list[dict[str, Any]]
_RETRYABLE_STATUS = {408, 429}  # plus every 5xx
_HINTS = {
    400: "check the model name, the message format, and that prompt + max_new_tokens fit the context",
    401: "set a valid key in MEMREADER_TEACHER_API_KEY (or OPENAI_API_KEY)",
    403: "this key has no access to the model; use another key or model",
    404: "check the model name (GET <base_url>/models lists them) and that base_url ends in /v1",
    413: "the prompt is too large; use smaller document windows",
    422: "the server rejected a parameter; check temperature, top_p, max_new_tokens and seed",
}


@dataclass(frozen=True)
class GenerationParams:
    """Decoding settings shared by every backend (defaults: the paper's multi-path sampling)."""

    temperature: float = field(0.7, help="sampling temperature; 0 means greedy decoding")
    top_p: float = field(0.8, help="nucleus sampling mass in (0, 1]")
    max_new_tokens: int = field(1024, help="most tokens generated per reply")
    repetition_penalty: float = field(1.0, help="HF/vLLM repetition penalty; 1.0 disables it")
    seed: int | None = field(None, help="sampling seed; None leaves sampling unseeded")

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "repetition_penalty"):  # 0 and 0.0 must give the same key()
            object.__setattr__(self, name, float(getattr(self, name)))
        problems = []
        if self.temperature < 0:
            problems.append(f"temperature={self.temperature} must be >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p={self.top_p} must be in (0, 1]")
        if int(self.max_new_tokens) != self.max_new_tokens or self.max_new_tokens < 1:
            problems.append(f"max_new_tokens={self.max_new_tokens} must be an integer >= 1")
        if self.repetition_penalty <= 0:
            problems.append(f"repetition_penalty={self.repetition_penalty} must be > 0 (1.0 = off)")
        if problems:
            raise ValueError("bad GenerationParams: " + "; ".join(problems))

    def key(self) -> str:
        """A canonical, process-independent string for cache keys."""
        return ",".join(f"{k}={v!r}" for k, v in sorted(asdict(self).items()))


class TeacherReply(str):
    """Reply text (the message content) plus what the server said about it."""

    reasoning: str | None
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None

    def __new__(cls, content: str, reasoning: str | None = None, finish_reason: str | None = None,
                prompt_tokens: int | None = None, completion_tokens: int | None = None) -> TeacherReply:
        obj = super().__new__(cls, content)
        obj.reasoning, obj.finish_reason = reasoning, finish_reason
        obj.prompt_tokens, obj.completion_tokens = prompt_tokens, completion_tokens
        return obj

    def with_think(self) -> str:
        """Content prefixed by ``<think>reasoning</think>`` when the server returned reasoning."""
        return f"<think>{self.reasoning}</think>\n{self}" if self.reasoning else str(self)


OnReply = Callable[[int, "TeacherReply"], None]
"""Called with (input index, reply) as soon as a reply exists."""


class TeacherRequestError(RuntimeError):
    """A teacher call failed for good: a non-retryable client error, or retries exhausted.

    Raised ``from None``: the client library's exception text may echo request details (a server can
    echo the key), so the redacted essentials are copied into this message and ``status`` instead.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # last HTTP status, None for timeouts and connection errors


class TeacherBackend(Protocol):
    """What data generation needs from a teacher."""

    async def agenerate(self, messages: Messages, params: GenerationParams) -> str:
        """One chat completion."""
        ...

    def generate_many(
        self, list_of_messages: Sequence[Messages], params: GenerationParams, progress_desc: str | None = None,
        on_reply: OnReply | None = None, return_exceptions: bool = False,
    ) -> list[Any]:
        """Many chat completions, in input order, with a progress bar and a one-line summary.

        ``on_reply(i, reply)`` is called as soon as reply ``i`` exists (callers persist it there, so
        an interruption loses nothing already paid for). With ``return_exceptions``, a request that
        fails for good (:class:`TeacherRequestError`) yields the exception in its slot instead of
        stopping the others.
        """
        ...


def _check_messages(messages: Messages) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"messages must be a non-empty list of {{'role', 'content'}} dicts, got {messages!r:.200}")
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"each message needs 'role' and 'content' keys, got {m!r:.200}")


def _log_summary(name: str, n: int, seconds: float, completion_tokens: int, retries: int) -> None:
    rate = n / seconds if seconds > 0 else float("inf")
    tok = f", {completion_tokens / seconds:.1f} tok/s" if completion_tokens and seconds > 0 else ""
    log.info("%s: %d replies in %.1f s (%.2f/s%s), %d retries", name, n, seconds, rate, tok, retries)


def _retry_after(headers: Any) -> float | None:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (seconds or HTTP date); None if absent/unreadable."""
    ms, value = headers.get("retry-after-ms"), (headers.get("retry-after") or "").strip()
    try:
        if ms:
            return max(float(ms) / 1000, 0.0)
        if value.replace(".", "", 1).isdigit():
            return float(value)
        if value:
            return max(email.utils.parsedate_to_datetime(value).timestamp() - time.time(), 0.0)
    except (TypeError, ValueError):
        log.warning("ignoring unreadable retry-after header %r", ms or value)
    return None


class OpenAITeacher:
    """Chat completions from an OpenAI-compatible server (OpenAI, DeepSeek, vLLM, ``memreader serve``).

    Retries 408/429/5xx, timeouts and connection errors with exponential backoff and jitter,
    honouring ``Retry-After`` (capped at ``backoff_max_s``); other 4xx fail at once with
    :class:`TeacherRequestError`. The API key never appears in logs, ``repr`` or error messages.
    """

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None, max_concurrency: int = 8,
                 max_retries: int = 5, timeout_s: float = 60, backoff_base_s: float = 1.0,
                 backoff_max_s: float = 30) -> None:
        if max_concurrency < 1 or max_retries < 0 or timeout_s <= 0:
            raise ValueError(f"need max_concurrency >= 1, max_retries >= 0, timeout_s > 0; got {max_concurrency}, "
                             f"{max_retries}, {timeout_s}")
        env = os.environ.get
        self.model = model
        self.base_url = base_url or env("MEMREADER_TEACHER_BASE_URL") or env("OPENAI_BASE_URL") or None
        key = api_key or env("MEMREADER_TEACHER_API_KEY") or env("OPENAI_API_KEY")
        if not key and not self.base_url:
            raise ValueError("no teacher API key: set MEMREADER_TEACHER_API_KEY (or OPENAI_API_KEY), or point "
                             "MEMREADER_TEACHER_BASE_URL at a local server such as `memreader serve`")
        self._api_key = key or "EMPTY"  # local servers (vLLM, memreader serve) accept any key
        self.max_concurrency, self.max_retries, self.timeout_s = max_concurrency, max_retries, timeout_s
        self.backoff_base_s, self.backoff_max_s = backoff_base_s, backoff_max_s
        self.retries = 0  # retries done over this object's lifetime
        self._rng = random.Random()
        # an AsyncOpenAI client and a semaphore per event loop: neither may be used across loops
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[Any, asyncio.Semaphore]] = (
            weakref.WeakKeyDictionary())

    def __repr__(self) -> str:
        return (f"OpenAITeacher(model={self.model!r}, base_url={self.base_url!r}, api_key='***', "
                f"max_concurrency={self.max_concurrency}, max_retries={self.max_retries}, timeout_s={self.timeout_s})")

    @property
    def _where(self) -> str:
        return f"teacher {self.model!r} at {self.base_url or 'api.openai.com'}"

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "***") if len(self._api_key) > 5 else text

    def _state(self) -> tuple[Any, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if loop not in self._states:
            from openai import AsyncOpenAI

            # max_retries=0: retries happen in agenerate, where they are counted, logged and tested.
            client = AsyncOpenAI(api_key=self._api_key, base_url=self.base_url, timeout=self.timeout_s, max_retries=0)
            self._states[loop] = (client, asyncio.Semaphore(self.max_concurrency))
        return self._states[loop]

    async def aclose(self) -> None:
        """Close the HTTP client of the running loop (``generate_many`` does this itself)."""
        state = self._states.pop(asyncio.get_running_loop(), None)
        if state is not None:
            await state[0].close()

    def _retry_delay(self, attempt: int, exc: Exception) -> float:
        """The server's Retry-After when it sent a usable one, else backoff with equal jitter."""
        response = getattr(exc, "response", None)
        server = _retry_after(response.headers) if response is not None else None
        if server is not None:
            return min(server, self.backoff_max_s)
        ceiling = min(self.backoff_max_s, self.backoff_base_s * 2**attempt)
        return ceiling / 2 + self._rng.uniform(0, ceiling / 2)

    async def agenerate(self, messages: Messages, params: GenerationParams) -> TeacherReply:
        """One chat completion with retries; at most ``max_concurrency`` in flight per event loop."""
        import openai

        _check_messages(messages)
        client, semaphore = self._state()
        extra = {"repetition_penalty": params.repetition_penalty} if params.repetition_penalty != 1.0 else None
        for attempt in range(self.max_retries + 1):
            try:
                async with semaphore:
                    response = await client.chat.completions.create(
                        model=self.model, messages=messages, temperature=params.temperature, top_p=params.top_p,
                        max_tokens=params.max_new_tokens, seed=params.seed, extra_body=extra)
                break
            except openai.APIStatusError as exc:
                status = exc.status_code
                if status not in _RETRYABLE_STATUS and status < 500:
                    hint = _HINTS.get(status, "fix the request; client errors are not retried")
                    raise TeacherRequestError(self._redact(
                        f"{self._where} answered HTTP {status}: {exc.message}. Fix: {hint}"), status) from None
                reason, last, last_status = f"HTTP {status}", exc, status
            except openai.APIConnectionError as exc:  # includes APITimeoutError
                cause = f" ({exc.__cause__!r})" if exc.__cause__ else ""
                reason, last, last_status = f"{type(exc).__name__}{cause}", exc, None
            if attempt == self.max_retries:
                raise TeacherRequestError(self._redact(
                    f"{self._where} failed {attempt + 1} times, last with {reason}: {last}. "
                    "Fix: check that the server is up, or raise max_retries / timeout_s"), last_status) from None
            delay = self._retry_delay(attempt, last)
            self.retries += 1
            log.warning("%s: attempt %d/%d failed (%s); retrying in %.2f s",
                        self._where, attempt + 1, self.max_retries + 1, reason, delay)
            await asyncio.sleep(delay)
        choice = response.choices[0]
        extras = choice.message.model_extra or {}
        usage = response.usage
        return TeacherReply(choice.message.content or "", extras.get("reasoning_content") or extras.get("reasoning"),
                            choice.finish_reason, usage.prompt_tokens if usage else None,
                            usage.completion_tokens if usage else None)

    async def _run_all(self, batch: Sequence[Messages], params: GenerationParams, bar: tqdm,
                       on_reply: OnReply | None, return_exceptions: bool) -> list[TeacherReply | TeacherRequestError]:
        async def one(i: int, messages: Messages) -> TeacherReply | TeacherRequestError:
            try:
                reply = await self.agenerate(messages, params)
            except TeacherRequestError as exc:
                if not return_exceptions:
                    raise
                log.warning("request %d failed for good: %s", i, exc)
                bar.update(1)
                return exc
            if on_reply is not None:
                on_reply(i, reply)
            bar.update(1)
            return reply

        tasks = [asyncio.create_task(one(i, m)) for i, m in enumerate(batch)]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # let cancelled requests unwind
            raise
        finally:
            await self.aclose()

    def generate_many(
        self, list_of_messages: Sequence[Messages], params: GenerationParams, progress_desc: str | None = None,
        on_reply: OnReply | None = None, return_exceptions: bool = False,
    ) -> list[Any]:
        """All requests concurrently (at most ``max_concurrency``); fails fast on the first one that fails for good."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass  # no loop running: the normal, synchronous case
        else:
            raise RuntimeError("generate_many is synchronous; inside an event loop, await agenerate() instead")
        for m in list_of_messages:
            _check_messages(m)
        start, retries_before = time.perf_counter(), self.retries
        with tqdm(total=len(list_of_messages), desc=progress_desc or f"teacher {self.model}", unit="req") as bar:
            replies = asyncio.run(self._run_all(list_of_messages, params, bar, on_reply, return_exceptions))
        _log_summary(f"teacher {self.model}", len(replies), time.perf_counter() - start,
                     sum(getattr(r, 'completion_tokens', 0) or 0 for r in replies), self.retries - retries_before)
        return list(replies)


@dataclass
class ChatGeneration:
    """One locally generated chat reply with its token accounting."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" (an end token) or "length" (max_new_tokens reached)


def generate_chat_batch(model: Any, tokenizer: Any, batch: Sequence[Messages],
                        params: GenerationParams) -> list[ChatGeneration]:
    """Left-padded batched generation through the tokenizer's chat template (greedy when temperature == 0)."""
    import torch

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
    if params.temperature == 0:
        kwargs["do_sample"] = False
    else:  # OpenAI semantics: no top-k cut, whatever the model's generation_config says
        kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=0)
        if params.seed is not None:
            torch.manual_seed(params.seed)
    with torch.inference_mode():
        out = model.generate(**enc, **kwargs)
    new = out[:, enc["input_ids"].shape[1]:].tolist()
    results = []
    for row, prompt_len in zip(new, enc["attention_mask"].sum(dim=1).tolist(), strict=True):
        stop = next((i for i, t in enumerate(row) if t in eos_ids), None)
        kept = row if stop is None else row[: stop + 1]
        results.append(ChatGeneration(tokenizer.decode(kept, skip_special_tokens=True), int(prompt_len), len(kept),
                                      "length" if stop is None else "stop"))
    return results


class LocalTeacher:
    """In-process transformers generation (the embedded SmolLM2 by default); loads on first use."""

    def __init__(self, model_name: str = "smollm2-135m-instruct", device: str = "auto", batch_size: int = 4,
                 adapter: str | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        self.model_name, self.device, self.batch_size, self.adapter = model_name, device, batch_size, adapter
        self._model: Any = None
        self._tokenizer: Any = None
        self._lock = threading.Lock()  # one generate() at a time: the model is not thread-safe

    def __repr__(self) -> str:
        return f"LocalTeacher(model_name={self.model_name!r}, device={self.device!r}, batch_size={self.batch_size})"

    def _generate(self, batch: Sequence[Messages], params: GenerationParams) -> list[TeacherReply]:
        with self._lock:
            if self._model is None:
                from memreader.registry import load_causal_lm, runtime

                rt = runtime(self.device)
                self._model, self._tokenizer = load_causal_lm(self.model_name, adapter=self.adapter, rt=rt)
            gens = generate_chat_batch(self._model, self._tokenizer, batch, params)
        return [TeacherReply(g.text, finish_reason=g.finish_reason, prompt_tokens=g.prompt_tokens,
                             completion_tokens=g.completion_tokens) for g in gens]

    async def agenerate(self, messages: Messages, params: GenerationParams) -> TeacherReply:
        """One reply, generated in a worker thread so the event loop stays responsive."""
        _check_messages(messages)
        return (await asyncio.to_thread(self._generate, [messages], params))[0]

    def generate_many(
        self, list_of_messages: Sequence[Messages], params: GenerationParams, progress_desc: str | None = None,
        on_reply: OnReply | None = None, return_exceptions: bool = False,
    ) -> list[Any]:
        """Batched generation, prompts grouped by length to cut padding; results in input order.

        With a seed, batch ``b`` samples with ``seed + b``: reproducible for the same inputs and batch_size.
        """
        for m in list_of_messages:
            _check_messages(m)
        start = time.perf_counter()
        order = sorted(range(len(list_of_messages)), key=lambda i: len(str(list_of_messages[i])))
        replies: list[TeacherReply | None] = [None] * len(order)
        with tqdm(total=len(order), desc=progress_desc or f"local {self.model_name}", unit="reply") as bar:
            for b, lo in enumerate(range(0, len(order), self.batch_size)):
                idx = order[lo: lo + self.batch_size]
                batch_params = params if params.seed is None else replace(params, seed=params.seed + b)
                for i, reply in zip(idx, self._generate([list_of_messages[i] for i in idx], batch_params), strict=True):
                    replies[i] = reply
                    if on_reply is not None:
                        on_reply(i, reply)
                bar.update(len(idx))
        done = [r for r in replies if r is not None]
        assert len(done) == len(order), "every prompt gets exactly one reply"
        _log_summary(f"local {self.model_name}", len(done), time.perf_counter() - start,
                     sum(r.completion_tokens or 0 for r in done), 0)
        return list(done)


def make_teacher(kind: str, **kw: Any) -> OpenAITeacher | LocalTeacher:
    """``"openai"`` → :class:`OpenAITeacher` (any OpenAI-compatible URL), ``"local"`` → :class:`LocalTeacher`."""
    kinds: dict[str, Any] = {"openai": OpenAITeacher, "local": LocalTeacher}
    if kind not in kinds:
        raise ValueError(f"teacher kind {kind!r} is not one of {sorted(kinds)}; use 'openai' for any HTTP endpoint")
    return kinds[kind](**kw)
