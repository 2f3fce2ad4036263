"""A teacher whose every reply is stored in a :class:`~memreader.data_gen.cache.ReplyCache` as it arrives."""

from __future__ import annotations

from dataclasses import asdict

from memreader.core.generation import GenerationParams, GenerationRequestError, Reply
from memreader.core.generation.sampling import row_seed
from memreader.data_gen.cache import ReplyCache, cache_key
from memreader.data_gen.flow import Dispatcher

Item = tuple[str, list[dict[str, str]]]
"""(template id, chat messages)."""


def sample_seed(seed: int | None, sample: int | None) -> int | None:
    """The decoding seed of candidate ``sample``: the run's seed for sample 0 (and for single
    replies), a distinct seed derived from both for every other sample."""
    if seed is None or not sample:
        return seed
    return row_seed(seed, "sample", sample) % (2**31 - 1)  # OpenAI-compatible servers take 32-bit seeds


class CachedTeacher:
    """Replies for ``(template_id, messages)`` items through a cache keyed by everything that shapes them
    (:func:`~memreader.data_gen.cache.cache_key`: a candidate's sample index too, so raising ``num_candidates``
    reuses the candidates already paid for)."""

    def __init__(self, dispatcher: Dispatcher, cache: ReplyCache, model: str, backend: str = "",
                 base_url: str = "", retry_unusable: bool = False) -> None:
        self.dispatcher, self.cache, self.model = dispatcher, cache, model
        self.backend, self.base_url, self.retry_unusable = backend, base_url, retry_unusable
        self.calls = 0

    def key(self, item: Item, params: GenerationParams, grammar: str | None = None, sample: int | None = None) -> str:
        """The cache key of one call."""
        return cache_key(item[0], self.model, asdict(params), item[1], self.backend, self.base_url, grammar, sample)

    def mark_unusable(self, item: Item, params: GenerationParams, grammar: str | None = None,
                      sample: int | None = None) -> None:
        """Record that this call's reply could not become a memory (``retry_unusable`` asks again)."""
        self.cache.mark_unusable(self.key(item, params, grammar, sample))

    async def ask(self, item: Item, params: GenerationParams, grammar: str | None = None,
                  sample: int | None = None) -> Reply | GenerationRequestError:
        """The cached reply, or a new one stored the moment it arrives (so an interruption loses
        nothing already paid for). A request that fails for good returns its
        :class:`GenerationRequestError` (nothing is stored: the next run asks again)."""
        key = self.key(item, params, grammar, sample)
        hit = self.cache.get(key, self.retry_unusable)
        if hit is not None:
            text, info = hit
            return Reply(text, finish_reason=info.get("finish_reason"), prompt_tokens=info.get("prompt_tokens"),
                         completion_tokens=info.get("completion_tokens"), guided=bool(info.get("guided")))
        self.calls += 1
        reply = await self.dispatcher.ask(item[1], params, grammar, sample_seed(params.seed, sample))
        if isinstance(reply, Reply):
            self.cache.put(key, str(reply), reply.info())
        return reply
