"""Keeping the teacher busy: per-document steps chained as replies arrive, requests always in flight.

    dispatcher = Dispatcher(backend, max_concurrency=64)          # or batch_size=8 for a local model
    reply = await dispatcher.ask(messages, params, grammar=lark, seed=7)

An async backend gets each request at once under ``max_concurrency``; a batch backend is fed by one worker,
``batch_size`` requests with equal decoding settings at a time. :class:`FlowStats` times every request (requests/s,
efficiency). Details: docs/ARCHITECTURE.md (The teacher flow).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from memreader.core.generation import GenerationParams, GenerationRequestError, Reply


@dataclass
class FlowStats:
    """Request count and latencies of everything that reached the backend (cache hits excluded)."""

    latencies: list[float] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    def summary(self, max_concurrency: int | None) -> dict[str, Any]:
        """requests, requests/s, mean latency and (for an async backend) the share of the ideal."""
        wall = time.perf_counter() - self.started
        n = len(self.latencies)
        mean = sum(self.latencies) / n if n else 0.0
        out: dict[str, Any] = {"requests": n, "wall_s": round(wall, 3), "requests_per_s": round(n / wall, 3) if wall else None,
                               "mean_latency_s": round(mean, 4)}
        if max_concurrency and n and wall > 0:
            out["efficiency"] = round(n * mean / max_concurrency / wall, 4)
        return out


@dataclass
class _Pending:
    messages: list[dict[str, Any]]
    params: GenerationParams
    grammar: str | None
    seed: int | None


class _Worker:
    """One background task that takes a batch of what coroutines queued (a subclass's ``_take``), runs it in a thread
    (``_call``; under ``compute_lock`` when given: the teacher and the evaluator share the CPU/GPU) and hands each
    waiting future its result (``_split``); an error is handed to every future of the batch, none is lost silently."""

    def __init__(self, compute_lock: asyncio.Lock | None) -> None:
        self.compute_lock = compute_lock
        self._queue: list[tuple[Any, asyncio.Future]] = []
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None

    async def _queued(self, entry: Any) -> Any:
        future = asyncio.get_running_loop().create_future()
        self._queue.append((entry, future))
        if self._worker is None or self._worker.done():
            self._wake = asyncio.Event()
            self._worker = asyncio.create_task(self._run())
        self._wake.set()  # type: ignore[union-attr]
        return await future

    async def _run(self) -> None:
        while True:
            if not self._queue:
                self._wake.clear()  # type: ignore[union-attr]
                await self._wake.wait()  # type: ignore[union-attr]
            for _ in range(3):  # let every coroutine that is ready add its request first
                await asyncio.sleep(0)
            batch = self._take()
            t0 = time.perf_counter()
            try:
                if self.compute_lock is None:
                    results = await asyncio.to_thread(self._call, [e for e, _ in batch])
                else:
                    async with self.compute_lock:
                        results = await asyncio.to_thread(self._call, [e for e, _ in batch])
            except Exception as exc:  # noqa: BLE001 - handed to every waiting future
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), result in zip(batch, self._split(batch, results, time.perf_counter() - t0), strict=True):
                if not future.done():
                    future.set_result(result)

    async def aclose(self) -> None:
        """Stop the worker."""
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)


class Dispatcher(_Worker):
    """Sends teacher requests from many concurrent document coroutines to one backend (see module doc)."""

    def __init__(self, backend: Any, max_concurrency: int = 8, batch_size: int = 8,
                 compute_lock: asyncio.Lock | None = None) -> None:
        if max_concurrency < 1 or batch_size < 1:
            raise ValueError(f"need max_concurrency >= 1 and batch_size >= 1, got {max_concurrency}, {batch_size}")
        super().__init__(compute_lock)
        self.backend, self.max_concurrency, self.batch_size = backend, max_concurrency, batch_size
        # OpenAIChat says so; in-process backends batch instead
        self.is_async = bool(getattr(backend, "concurrent_requests", False))
        self._slots: asyncio.Semaphore | None = None  # made inside the running loop
        self.stats = FlowStats()

    async def ask(self, messages: list[dict[str, Any]], params: GenerationParams, grammar: str | None = None,
                  seed: int | None = None) -> Reply | GenerationRequestError:
        """One reply (or the request's final error) for these messages; ``seed`` overrides ``params.seed``."""
        if not self.is_async:
            return await self._queued(_Pending(messages, params, grammar, params.seed if seed is None else seed))
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_concurrency)
        async with self._slots:  # timed inside the slot: the latency is the request's, not the queue's
            t0 = time.perf_counter()
            try:
                reply = await self.backend.agenerate(messages, params if seed is None else replace(params, seed=seed),
                                                     grammar)
            except GenerationRequestError as exc:
                return exc
            finally:
                self.stats.latencies.append(time.perf_counter() - t0)
        return reply if isinstance(reply, Reply) else Reply(str(reply))

    def _take(self) -> list[tuple[_Pending, asyncio.Future]]:
        """Up to ``batch_size`` waiting requests with the decoding settings of the first (seeds aside)."""
        head = replace(self._queue[0][0].params, seed=None)
        batch = [e for e in self._queue if replace(e[0].params, seed=None) == head][: self.batch_size]
        taken = {id(e) for e in batch}
        self._queue = [e for e in self._queue if id(e) not in taken]
        return batch

    def _call(self, batch: list[_Pending]) -> list[Any]:
        return self.backend.generate_many([p.messages for p in batch], batch[0].params, return_exceptions=True,
                                          grammars=[p.grammar for p in batch], seeds=[p.seed for p in batch])

    def _split(self, batch: list[tuple[_Pending, asyncio.Future]], results: list[Any], seconds: float) -> list[Any]:
        self.stats.latencies += [seconds] * len(batch)
        return [out if isinstance(out, (Reply, GenerationRequestError)) else Reply(str(out)) for out in results]

    async def aclose(self) -> None:
        """Stop the batch worker and close an async backend's HTTP client."""
        await super().aclose()
        close = getattr(self.backend, "aclose", None)
        if close is not None and self.is_async:
            await close()


class Batcher(_Worker):
    """Collects work items from many coroutines and runs them in batches through ``fn(items)`` in a
    thread (the evaluator scorer: one call scores every memory waiting at that moment)."""

    def __init__(self, fn: Callable[[list[Any]], Sequence[Any]], max_items: int = 64,
                 compute_lock: asyncio.Lock | None = None) -> None:
        super().__init__(compute_lock)
        self.fn, self.max_items = fn, max_items

    async def submit(self, items: list[Any]) -> list[Any]:
        """Results for ``items``, in order."""
        return await self._queued(items)

    def _take(self) -> list[tuple[list[Any], asyncio.Future]]:
        """Whole submissions, as many as fit ``max_items`` (at least one)."""
        batch, n = [], 0
        while self._queue and (not batch or n + len(self._queue[0][0]) <= self.max_items):
            batch.append(self._queue.pop(0))
            n += len(batch[-1][0])
        return batch

    def _call(self, groups: list[list[Any]]) -> Sequence[Any]:
        return self.fn([x for items in groups for x in items])

    def _split(self, batch: list[tuple[list[Any], asyncio.Future]], results: Sequence[Any],
               seconds: float) -> list[Any]:
        ends = list(itertools.accumulate(len(items) for items, _ in batch))
        return [list(results[end - len(items): end]) for (items, _), end in zip(batch, ends, strict=True)]


async def gather_bounded(factories: Sequence[Callable[[], Awaitable[Any]]], limit: int) -> list[Any]:
    """Run coroutine factories with at most ``limit`` alive at once; results in order. The first
    exception cancels the rest and is raised."""
    semaphore = asyncio.Semaphore(limit)

    async def one(make: Callable[[], Awaitable[Any]]) -> Any:
        async with semaphore:
            return await make()

    tasks = [asyncio.create_task(one(f)) for f in factories]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
