"""What every generation backend shares: decoding settings, the reply type (a ``str``, so callers that only want
text use it as one), the failure type; and the request loop of the in-process backends (:class:`BatchChat`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from memreader.core.config import field
from memreader.core.config import validate as validate_config
from memreader.core.errors import MemReaderError

log = logging.getLogger(__name__)

Messages = list[dict[str, Any]]


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
        validate_config(self)

    def problems(self) -> list[str]:
        """Every value out of range, with the rule (:func:`memreader.core.config.validate`)."""
        problems = []
        if self.temperature < 0:
            problems.append(f"temperature={self.temperature} must be >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p={self.top_p} must be in (0, 1]")
        if int(self.max_new_tokens) != self.max_new_tokens or self.max_new_tokens < 1:
            problems.append(f"max_new_tokens={self.max_new_tokens} must be an integer >= 1")
        if self.repetition_penalty <= 0:
            problems.append(f"repetition_penalty={self.repetition_penalty} must be > 0 (1.0 = off)")
        return problems

    def key(self) -> str:
        """A canonical, process-independent string for cache keys."""
        return ",".join(f"{k}={v!r}" for k, v in sorted(asdict(self).items()))


class Reply(str):
    """Reply text (the message content) plus what the backend said about it.

    ``finish_reason`` is ``"stop"`` (an end token, or the grammar closed) or ``"length"`` (the
    token budget ran out: the text is cut off); ``guided`` says whether a grammar constrained it;
    ``cached_tokens`` how many prompt tokens the engine's prefix cache served (vLLM; None elsewhere; not in
    :meth:`info`, since it depends on what ran before, not on the reply).
    """

    reasoning: str | None
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    guided: bool
    cached_tokens: int | None

    def __new__(cls, content: str, reasoning: str | None = None, finish_reason: str | None = None,
                prompt_tokens: int | None = None, completion_tokens: int | None = None,
                guided: bool = False, cached_tokens: int | None = None) -> Reply:
        obj = super().__new__(cls, content)
        obj.reasoning, obj.finish_reason = reasoning, finish_reason
        obj.prompt_tokens, obj.completion_tokens = prompt_tokens, completion_tokens
        obj.guided, obj.cached_tokens = guided, cached_tokens
        return obj

    @property
    def truncated(self) -> bool:
        """True when the budget ran out before the model (or its grammar) finished."""
        return self.finish_reason == "length"

    def info(self) -> dict[str, Any]:
        """How the reply was made, for a memory's meta and the reply cache."""
        return {"guided": self.guided, "finish_reason": self.finish_reason, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens}


OnReply = Callable[[int, "Reply"], None]
"""Called with (input index, reply) as soon as a reply exists."""


class GenerationRequestError(MemReaderError, RuntimeError):
    """A teacher call failed for good: a non-retryable client error, or retries exhausted.

    Raised ``from None``: the client library's exception text may echo request details (a server can
    echo the key), so the redacted essentials are copied into this message and ``status`` instead.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # last HTTP status, None for timeouts and connection errors


def check_messages(messages: Messages) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"messages must be a non-empty list of {{'role', 'content'}} dicts, got {messages!r:.200}")
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"each message needs 'role' and 'content' keys, got {m!r:.200}")


def log_summary(name: str, n: int, seconds: float, completion_tokens: int, retries: int, loud: bool = True) -> None:
    """One line per ``generate_many``: at INFO for a stage's own call, at DEBUG inside a caller's loop."""
    rate = n / seconds if seconds > 0 else float("inf")
    tok = f", {completion_tokens / seconds:.1f} tok/s" if completion_tokens and seconds > 0 else ""
    log.log(logging.INFO if loud else logging.DEBUG, "%s: %d replies in %.1f s (%.2f/s%s), %d retries", name, n, seconds, rate, tok, retries)


def chat_prompt_tokens(tokenizer: Any, messages: Messages) -> int:
    """Tokens of the prompt ``messages`` become through ``tokenizer``'s chat template, the assistant turn opened."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


class BatchChat:
    """The request loop of the in-process backends (``LocalChat``, ``VLLMChat``): a request that cannot run
    (:meth:`_request_error`) raises or, with ``return_exceptions``, is the exception in its slot; the others go to
    the backend's :meth:`_replies`; ``on_reply`` as each reply arrives; one summary line named ``LOG_NAME``."""

    LOG_NAME = ""
    concurrent_requests = False  # a batch backend: the teacher's dispatcher feeds it whole batches
    model_name: str

    async def agenerate(self, messages: Messages, params: GenerationParams, grammar: str | None = None) -> Reply:
        """One reply: the batch of one in a worker thread, so the event loop stays responsive."""
        import asyncio

        return (await asyncio.to_thread(self.generate_many, [messages], params, None, None, False, [grammar]))[0]

    def prompt_tokens(self, messages: Messages) -> int:
        """Tokens of the prompt ``messages`` become (the chat template with the assistant turn opened)."""
        return chat_prompt_tokens(self.tokenizer(), messages)

    def _request_error(self, messages: Messages, grammar: str | None, params: GenerationParams) -> Exception | None:
        """Why this request cannot run (a prompt too long, a grammar the engine refuses), else None."""
        raise NotImplementedError

    def _replies(self, messages_list: Sequence[Messages], todo: list[int], params: GenerationParams,
                 grammars: list[str | None], seeds: list[int | None],
                 progress_desc: str | None) -> Iterable[tuple[int, Reply]]:
        """``(i, reply)`` for every index in ``todo``, each as soon as the backend has it."""
        raise NotImplementedError

    def generate_many(
        self, messages_list: Sequence[Messages], params: GenerationParams, progress_desc: str | None = None,
        on_reply: OnReply | None = None, return_exceptions: bool = False,
        grammars: Sequence[str | None] | None = None, seeds: Sequence[int | None] | None = None,
    ) -> list[Any]:
        """One reply per conversation, in input order, with a progress bar and a one-line summary (every backend's
        ``generate_many`` keeps this contract).

        ``on_reply(i, reply)`` is called as soon as reply ``i`` exists (callers persist it there, so an interruption
        loses nothing already paid for). With ``return_exceptions``, a request that fails for good yields the
        exception in its slot instead of stopping the others. ``grammars[i]`` (a lark grammar, or None) constrains
        reply ``i``; ``seeds[i]`` (default ``params.seed``) seeds it on its own, so a reply does not depend on its
        batch."""
        for m in messages_list:
            check_messages(m)
        rows = list(grammars) if grammars is not None else [None] * len(messages_list)
        row_seeds = list(seeds) if seeds is not None else [params.seed] * len(messages_list)
        out: list[Any] = [None] * len(messages_list)
        for i, (m, g) in enumerate(zip(messages_list, rows, strict=True)):
            error = self._request_error(m, g, params)
            if error is not None:
                if not return_exceptions:
                    raise error
                out[i] = error
        todo = [i for i, r in enumerate(out) if r is None]
        start = time.perf_counter()
        for i, reply in self._replies(messages_list, todo, params, rows, row_seeds, progress_desc):
            out[i] = reply
            if on_reply is not None:
                on_reply(i, reply)
        n_tok = sum(r.completion_tokens or 0 for r in out if isinstance(r, Reply))
        log_summary(f"{self.LOG_NAME} {self.model_name}", len(todo), time.perf_counter() - start, n_tok, 0,
                    progress_desc is not None)
        return out
