"""Generation as a stream: requests go in as they are ready, replies come out as they finish.

    stream = open_stream(backend, window=24)
    stream.submit(StreamRequest(tag, messages, params, grammar, seed))
    while stream.pending:
        for tag, reply in stream.step(): ...   # replies (or request errors) that finished in this step

:class:`BatchStream` works over any backend's ``generate_many`` (one batch of same-settings requests per step, the
shortest prompts first); a backend with its own ``stream(window)`` (vLLM's ``VLLMStream``) is used as it is.
Details: docs/ENGINES.md (Reading keeps the engine full).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from memreader.core.generation.params import GenerationParams, Messages, check_messages


@dataclass
class StreamRequest:
    """One request of a stream; ``tag`` is the caller's, handed back with the reply."""

    tag: Any
    messages: Messages
    params: GenerationParams
    grammar: str | None = None
    seed: int | None = None


class Stream(Protocol):
    """What a stream offers its caller."""

    window: int

    @property
    def pending(self) -> int:
        """Requests submitted whose reply has not been handed back yet."""
        ...

    def submit(self, request: StreamRequest) -> None:
        """Queue one request (a request that cannot run comes back as a request error from :meth:`step`)."""
        ...

    def step(self) -> list[tuple[Any, Any]]:
        """Run the engine until at least one reply is in (or none is pending); ``(tag, reply or error)`` pairs."""
        ...

    def close(self) -> None:
        """Drop every request still pending (the caller stops early: an error, an interrupt)."""
        ...


class BatchStream:
    """A stream over ``backend.generate_many``: one batch of up to ``batch_size`` requests per step."""

    def __init__(self, backend: Any, batch_size: int, window: int | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        self.backend, self.batch_size = backend, batch_size
        self.window = max(window or 0, batch_size)
        self._queue: list[StreamRequest] = []

    @property
    def pending(self) -> int:
        return len(self._queue)

    def submit(self, request: StreamRequest) -> None:
        check_messages(request.messages)
        self._queue.append(request)

    def step(self) -> list[tuple[Any, Any]]:
        if not self._queue:
            return []
        params = self._queue[0].params  # one generate_many call takes one set of decoding settings
        same = sorted((r for r in self._queue if r.params == params), key=lambda r: _prompt_size(r.messages))
        batch = same[: self.batch_size]
        taken = {id(r) for r in batch}
        self._queue = [r for r in self._queue if id(r) not in taken]
        seeded = any(r.seed is not None for r in batch)  # else each backend seeds from params.seed
        replies = self.backend.generate_many([r.messages for r in batch], params, return_exceptions=True,
                                             grammars=[r.grammar for r in batch],
                                             **({"seeds": [r.seed for r in batch]} if seeded else {}))
        return [(r.tag, reply) for r, reply in zip(batch, replies, strict=True)]

    def close(self) -> None:
        self._queue.clear()


def _prompt_size(messages: Sequence[dict[str, Any]]) -> int:
    return sum(len(str(m.get("content", ""))) for m in messages)


def open_stream(backend: Any, batch_size: int, window: int | None = None) -> Stream:
    """The backend's own stream when it has one (``backend.stream(window)``: that many requests in the running
    engine), else a :class:`BatchStream` of ``batch_size``; ``window`` (default ``batch_size``): requests the caller
    keeps submitted. A :class:`BatchStream`'s batches are then the documents in corpus order, as a fixed group would
    hold them (a larger window sorts several batches' worth by length, which changes which rows share a batch, and
    with it a transformers reply's last bits: a sharded read would no longer equal a plain one)."""
    own = getattr(backend, "stream", None)
    if callable(own):
        return own(window or batch_size)
    return BatchStream(backend, batch_size, window)
