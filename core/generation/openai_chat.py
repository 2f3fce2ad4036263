"""Chat completions from any OpenAI-compatible server (OpenAI, DeepSeek, vLLM, ``memreader serve``).

    from memreader.core.generation import GenerationParams, make_chat
    chat = make_chat("openai", model="deepseek-reasoner", base_url="https://api.deepseek.com/v1")
    texts = chat.generate_many([[{"role": "user", "content": "hi"}]], GenerationParams(seed=0))

Guided requests, ``guided="auto"`` and ``reasoning_content``: docs/ARCHITECTURE.md (Guided decoding: Enforcement).
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import os
import random
import time
import weakref
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tqdm.auto import tqdm

from memreader.core.config import ConfigError
from memreader.core.generation.params import (
    GenerationParams,
    GenerationRequestError,
    Messages,
    OnReply,
    Reply,
    check_messages,
    log_summary,
)

log = logging.getLogger(__name__)

_RETRYABLE_STATUS = {408, 429}  # plus every 5xx
_HINTS = {
    400: "check the model name, the message format, and that prompt + max_new_tokens fit the context",
    401: "set a valid key in MEMREADER_TEACHER_API_KEY (MEMREADER_READER_API_KEY for `read`; OPENAI_API_KEY "
         "is used for api.openai.com only)",
    403: "this key has no access to the model; use another key or model",
    404: "check the model name (GET <base_url>/models lists them) and that base_url ends in /v1",
    413: "the prompt is too large; use smaller document windows",
    422: "the server rejected a parameter; check temperature, top_p, max_new_tokens and seed",
}
class EndpointUnreachable(ConfigError):
    """Nothing answers at an endpoint's URL: a configuration problem (exit 2), found before any request."""


GRAMMAR_SERVERS = ("vllm", "memreader")  # GET /models "owned_by" values of servers that take a grammar


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


def is_openai(base_url: str | None) -> bool:
    """True for OpenAI's own API (no base URL, or a URL on api.openai.com)."""
    if not base_url:
        return True
    from urllib.parse import urlparse

    return (urlparse(base_url).hostname or "").lower() == "api.openai.com"


class OpenAIChat:
    """Chat completions from an OpenAI-compatible server (OpenAI, DeepSeek, vLLM, ``memreader serve``).

    Retries 408/429/5xx, timeouts and connection errors with exponential backoff and jitter,
    honouring ``Retry-After`` (capped at ``backoff_max_s``); other 4xx fail at once with
    :class:`GenerationRequestError`. The API key never appears in logs, ``repr`` or error messages.
    """

    concurrent_requests = True  # agenerate may be awaited many times at once (memreader.data_gen.flow.Dispatcher)

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None, max_concurrency: int = 8,
                 max_retries: int = 5, timeout_s: float = 60, backoff_base_s: float = 1.0,
                 backoff_max_s: float = 30, guided: str = "auto", env_prefix: str = "MEMREADER_TEACHER") -> None:
        if max_concurrency < 1 or max_retries < 0 or timeout_s <= 0:
            raise ValueError(f"need max_concurrency >= 1, max_retries >= 0, timeout_s > 0; got {max_concurrency}, "
                             f"{max_retries}, {timeout_s}")
        env = os.environ.get
        self.model, self.env_prefix = model, env_prefix
        self.base_url = base_url or env(f"{env_prefix}_BASE_URL") or None
        # OPENAI_API_KEY goes to OpenAI's own endpoint only: never to a third-party URL.
        key = api_key or env(f"{env_prefix}_API_KEY") or (env("OPENAI_API_KEY") if is_openai(self.base_url) else None)
        if not key and is_openai(self.base_url):
            raise ConfigError(f"no API key for {self.base_url or 'api.openai.com'}: set {env_prefix}_API_KEY (or "
                              f"OPENAI_API_KEY for OpenAI itself), or point {env_prefix}_BASE_URL / base_url at "
                              "another endpoint such as `memreader serve`")
        self._api_key = key or "EMPTY"  # local servers (vLLM, memreader serve) accept any key
        self.max_concurrency, self.max_retries, self.timeout_s = max_concurrency, max_retries, timeout_s
        self.backoff_base_s, self.backoff_max_s = backoff_base_s, backoff_max_s
        if guided not in ("auto", "on", "off"):
            raise ValueError(f"guided={guided!r} must be 'auto', 'on' or 'off'")
        self.guided = guided
        self._takes_grammar: bool | None = None if guided == "auto" else guided == "on"
        self.retries = 0  # retries done over this object's lifetime
        self._rng = random.Random()
        # an AsyncOpenAI client and a semaphore per event loop: neither may be used across loops
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[Any, asyncio.Semaphore]] = (
            weakref.WeakKeyDictionary())

    def __repr__(self) -> str:
        return (f"OpenAIChat(model={self.model!r}, base_url={self.base_url!r}, api_key='***', "
                f"max_concurrency={self.max_concurrency}, max_retries={self.max_retries}, timeout_s={self.timeout_s})")

    @property
    def _where(self) -> str:
        return f"teacher {self.model!r} at {self.base_url or 'api.openai.com'}"

    def check_reachable(self, timeout_s: float = 5.0) -> None:
        """Refuse an endpoint nothing answers at (connection refused, unknown host, no reply in ``timeout_s``)
        before any document is sent, as a configuration error (exit 2); any HTTP reply, even an error, passes."""
        import httpx

        url = f"{(self.base_url or 'https://api.openai.com/v1').rstrip('/')}/models"
        try:
            httpx.get(url, headers={"Authorization": f"Bearer {self._api_key}"}, timeout=timeout_s)
        except httpx.TransportError as exc:
            raise EndpointUnreachable(
                f"{self._where}: nothing answers at {url} ({type(exc).__name__}: {self._redact(str(exc))[:200]})",
                f"start the server (for vLLM: python -m vllm.entrypoints.openai.api_server --model ... --port ...; "
                f"docs/ENGINES.md), or fix base_url / {self.env_prefix}_BASE_URL") from None

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

    async def takes_grammar(self) -> bool:
        """Whether this endpoint gets grammars: ``guided`` on/off, or for ``auto`` the server's own
        word (``owned_by`` in ``GET /models``). Asked once per client; a failed probe means no."""
        if self._takes_grammar is None:
            import openai

            client, _ = self._state()
            try:
                models = await client.models.list()
                owners = {str(getattr(m, "owned_by", "")).lower() for m in models.data}
            except openai.APIError as exc:  # cannot tell: stay unguided, loudly
                log.warning("%s: GET /models failed (%s); replies stay unguided (set guided=on to force)",
                            self._where, type(exc).__name__)
                owners = set()
            self._takes_grammar = bool(owners & set(GRAMMAR_SERVERS))
            log.info("%s: %s", self._where, "takes grammars: guided decoding on" if self._takes_grammar else
                     "cannot take a grammar (not a vLLM/memreader server): unguided, parser + aligner")
        return self._takes_grammar

    async def agenerate(self, messages: Messages, params: GenerationParams, grammar: str | None = None) -> Reply:
        """One chat completion with retries; at most ``max_concurrency`` in flight per event loop.

        ``grammar`` (lark) is sent when the endpoint takes grammars; otherwise the reply is unguided
        (``reply.guided`` is False).
        """
        import openai

        check_messages(messages)
        client, semaphore = self._state()
        extra: dict[str, Any] = {}
        if params.repetition_penalty != 1.0:
            extra["repetition_penalty"] = params.repetition_penalty
        guided = grammar is not None and await self.takes_grammar()
        if guided:
            extra["structured_outputs"] = {"grammar": grammar}
        for attempt in range(self.max_retries + 1):
            try:
                async with semaphore:
                    response = await client.chat.completions.create(
                        model=self.model, messages=messages, temperature=params.temperature, top_p=params.top_p,
                        max_tokens=params.max_new_tokens, seed=params.seed, extra_body=extra or None)
                break
            except openai.APIStatusError as exc:
                status = exc.status_code
                if status not in _RETRYABLE_STATUS and status < 500:
                    hint = _HINTS.get(status, "fix the request; client errors are not retried")
                    raise GenerationRequestError(self._redact(
                        f"{self._where} answered HTTP {status}: {exc.message}. Fix: {hint}"), status) from None
                reason, last, last_status = f"HTTP {status}", exc, status
            except openai.APIConnectionError as exc:  # includes APITimeoutError
                cause = f" ({exc.__cause__!r})" if exc.__cause__ else ""
                reason, last, last_status = f"{type(exc).__name__}{cause}", exc, None
            if attempt == self.max_retries:
                raise GenerationRequestError(self._redact(
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
        return Reply(choice.message.content or "", extras.get("reasoning_content") or extras.get("reasoning"),
                     choice.finish_reason, usage.prompt_tokens if usage else None,
                     usage.completion_tokens if usage else None, guided)

    async def _run_all(self, batch: Sequence[Messages], params: GenerationParams, bar: tqdm, on_reply: OnReply | None,
                       return_exceptions: bool, grammars: Sequence[str | None],
                       seeds: Sequence[int | None] | None) -> list[Reply | GenerationRequestError]:
        async def one(i: int, messages: Messages) -> Reply | GenerationRequestError:
            p = params if seeds is None else replace(params, seed=seeds[i])
            try:
                reply = await self.agenerate(messages, p, grammars[i])
            except GenerationRequestError as exc:
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
        on_reply: OnReply | None = None, return_exceptions: bool = False, grammars: Sequence[str | None] | None = None,
        seeds: Sequence[int | None] | None = None,
    ) -> list[Any]:
        """All requests concurrently (at most ``max_concurrency``), as :meth:`BatchChat.generate_many` promises; fails
        fast on the first one that fails for good. ``seeds[i]`` (default ``params.seed``) is request ``i``'s ``seed``."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass  # no loop running: the normal, synchronous case
        else:
            raise RuntimeError("generate_many is synchronous; inside an event loop, await agenerate() instead")
        for m in list_of_messages:
            check_messages(m)
        start, retries_before = time.perf_counter(), self.retries
        with tqdm(total=len(list_of_messages), desc=progress_desc, unit="req", disable=progress_desc is None) as bar:
            replies = asyncio.run(self._run_all(list_of_messages, params, bar, on_reply, return_exceptions,
                                                grammars or [None] * len(list_of_messages), seeds))
        log_summary(f"teacher {self.model}", len(replies), time.perf_counter() - start,
                    sum(getattr(r, 'completion_tokens', 0) or 0 for r in replies), self.retries - retries_before,
                    progress_desc is not None)
        return list(replies)


