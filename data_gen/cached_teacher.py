"""A teacher whose every reply is stored in a :class:`~data_gen.cache.ReplyCache` as it arrives."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from data_gen.cache import ReplyCache, cache_key
from memreader.generation import GenerationParams, GenerationRequestError, Reply

Item = tuple[str, list[dict[str, str]]]
"""(template id, chat messages)."""


class CachedTeacher:
    """Replies for ``(template_id, messages)`` items through a cache keyed by everything that shapes them.

    ``backend`` and ``base_url`` are part of every key, so a reply from one endpoint is never
    replayed for another; so is the grammar that guided a reply.
    """

    def __init__(self, teacher: Any, cache: ReplyCache, model: str, backend: str = "",
                 base_url: str = "", retry_unusable: bool = False) -> None:
        self.teacher, self.cache, self.model = teacher, cache, model
        self.backend, self.base_url, self.retry_unusable = backend, base_url, retry_unusable
        self.calls = 0

    def key(self, item: Item, params: GenerationParams, grammar: str | None = None) -> str:
        """The cache key of one call."""
        return cache_key(item[0], self.model, asdict(params), item[1], self.backend, self.base_url, grammar)

    def mark_unusable(self, item: Item, params: GenerationParams, grammar: str | None = None) -> None:
        """Record that this call's reply could not become a memory (``retry_unusable`` asks again)."""
        self.cache.mark_unusable(self.key(item, params, grammar))

    def generate(self, items: Sequence[Item], params: GenerationParams, desc: str,
                 grammars: Sequence[str | None] | None = None) -> list[Reply | GenerationRequestError]:
        """Replies in order; cached ones are not asked again (unless unusable and ``retry_unusable``).

        Each reply is stored the moment it arrives, so an interruption or a failing neighbour loses
        nothing already paid for. A request that fails for good leaves its
        :class:`GenerationRequestError` in its slot (and is asked again on the next run).
        """
        rows = list(grammars) if grammars is not None else [None] * len(items)
        keys = [self.key(item, params, g) for item, g in zip(items, rows, strict=True)]
        replies: list[Reply | GenerationRequestError | None] = []
        for k in keys:
            hit = self.cache.get(k, self.retry_unusable)
            replies.append(None if hit is None else _reply(*hit))
        todo = [i for i, r in enumerate(replies) if r is None]
        if todo:  # one call, so one progress bar per stage; replies are stored as each one arrives

            def store(j: int, reply: Reply) -> None:
                self.cache.put(keys[todo[j]], str(reply), reply.info() if isinstance(reply, Reply) else {})

            outs = self.teacher.generate_many([items[i][1] for i in todo], params, progress_desc=desc,
                                              on_reply=store, return_exceptions=True,
                                              grammars=[rows[i] for i in todo])
            for i, out in zip(todo, outs, strict=True):
                replies[i] = out if isinstance(out, (Reply, GenerationRequestError)) else Reply(str(out))
            self.calls += len(todo)
        assert all(r is not None for r in replies), "every item has a reply or an error"
        return replies  # type: ignore[return-value]


def _reply(text: str, info: dict[str, Any]) -> Reply:
    return Reply(text, finish_reason=info.get("finish_reason"), prompt_tokens=info.get("prompt_tokens"),
                 completion_tokens=info.get("completion_tokens"), guided=bool(info.get("guided")))
