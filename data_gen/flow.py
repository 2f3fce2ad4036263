"""Keeping the teacher busy: per-document steps chained as replies arrive, requests always in flight.

    dispatcher = Dispatcher(backend, max_concurrency=64)          # or batch_size=8 for a local model
    reply = await dispatcher.ask(messages, params, grammar=lark, seed=7)

A stage-by-stage pipeline waits for its slowest request at every step; here every document runs
as its own coroutine (outline → candidates → scoring → CoM) and asks the moment its previous reply
is in. What "in flight" means depends on the backend:

- an **async** backend (:class:`~memreader.core.generation.OpenAIChat`) gets each request at once; its own
  semaphore keeps exactly ``max_concurrency`` requests open while any are waiting;
- a **batch** backend (:class:`~memreader.core.generation.LocalChat`, ``VLLMChat``) is fed by one worker
  that takes the waiting requests with equal decoding settings, up to ``batch_size`` at a time
  (per-request seeds, so batching never changes a reply), and runs them in a thread.

:class:`FlowStats` times every request that reached the backend, so a run can report requests/s
and its efficiency: ``(requests × mean latency / max_concurrency) / wall time`` (1.0 = the endpoint
was never idle below the concurrency limit).
"""

from __future__ import annotations

import asyncio
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
    future: asyncio.Future


class Dispatcher:
    """Sends teacher requests from many concurrent document coroutines to one backend (see module doc)."""

    def __init__(self, backend: Any, max_concurrency: int = 8, batch_size: int = 8,
                 compute_lock: asyncio.Lock | None = None) -> None:
        if max_concurrency < 1 or batch_size < 1:
            raise ValueError(f"need max_concurrency >= 1 and batch_size >= 1, got {max_concurrency}, {batch_size}")
        self.backend, self.max_concurrency, self.batch_size = backend, max_concurrency, batch_size
        # OpenAIChat says so; in-process backends batch instead
        self.is_async = bool(getattr(backend, "concurrent_requests", False))
        self.compute_lock = compute_lock
        self._slots: asyncio.Semaphore | None = None  # made inside the running loop
        self.stats = FlowStats()
        self._queue: list[_Pending] = []
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None

    async def ask(self, messages: list[dict[str, Any]], params: GenerationParams, grammar: str | None = None,
                  seed: int | None = None) -> Reply | GenerationRequestError:
        """One reply (or the request's final error) for these messages; ``seed`` overrides ``params.seed``."""
        if self.is_async:
            if self._slots is None:
                self._slots = asyncio.Semaphore(self.max_concurrency)
            async with self._slots:  # timed inside the slot: the latency is the request's, not the queue's
                t0 = time.perf_counter()
                try:
                    reply = await self.backend.agenerate(
                        messages, params if seed is None else replace(params, seed=seed), grammar)
                except GenerationRequestError as exc:
                    return exc
                finally:
                    self.stats.latencies.append(time.perf_counter() - t0)
            return reply if isinstance(reply, Reply) else Reply(str(reply))
        future = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(messages, params, grammar, params.seed if seed is None else seed, future))
        self._ensure_worker()
        self._wake.set()  # type: ignore[union-attr]
        return await future

    def _ensure_worker(self) -> None:
        if self._worker is None or self._worker.done():
            self._wake = asyncio.Event()
            self._worker = asyncio.create_task(self._run_batches())

    async def _run_batches(self) -> None:
        while True:
            if not self._queue:
                self._wake.clear()  # type: ignore[union-attr]
                await self._wake.wait()  # type: ignore[union-attr]
            for _ in range(3):  # let every coroutine that is ready add its request first
                await asyncio.sleep(0)
            head = self._queue[0].params
            batch = [p for p in self._queue if replace(p.params, seed=None) == replace(head, seed=None)][: self.batch_size]
            taken = {id(p) for p in batch}
            self._queue = [p for p in self._queue if id(p) not in taken]
            t0 = time.perf_counter()
            try:
                outs = await self._on_device(lambda batch=batch, head=head: self.backend.generate_many(
                    [p.messages for p in batch], head, return_exceptions=True, grammars=[p.grammar for p in batch],
                    seeds=[p.seed for p in batch]))
            except Exception as exc:  # noqa: BLE001 - handed to every waiting request, none is lost silently
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            dt = time.perf_counter() - t0
            for p, out in zip(batch, outs, strict=True):
                self.stats.latencies.append(dt)
                if not p.future.done():
                    p.future.set_result(out if isinstance(out, (Reply, GenerationRequestError)) else Reply(str(out)))

    async def _on_device(self, fn: Callable[[], Any]) -> Any:
        if self.compute_lock is None:
            return await asyncio.to_thread(fn)
        async with self.compute_lock:
            return await asyncio.to_thread(fn)

    async def aclose(self) -> None:
        """Stop the batch worker and close an async backend's HTTP client."""
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        close = getattr(self.backend, "aclose", None)
        if close is not None and self.is_async:
            await close()


class Batcher:
    """Collects work items from many coroutines and runs them in batches through ``fn(items)`` in a
    thread (the evaluator scorer: one call scores every memory waiting at that moment)."""

    def __init__(self, fn: Callable[[list[Any]], Sequence[Any]], max_items: int = 64,
                 compute_lock: asyncio.Lock | None = None) -> None:
        self.fn, self.max_items, self.compute_lock = fn, max_items, compute_lock
        self._queue: list[tuple[list[Any], asyncio.Future]] = []
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None

    async def submit(self, items: list[Any]) -> list[Any]:
        """Results for ``items``, in order."""
        future = asyncio.get_running_loop().create_future()
        self._queue.append((items, future))
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
            for _ in range(3):
                await asyncio.sleep(0)
            group, n = [], 0
            while self._queue and (not group or n + len(self._queue[0][0]) <= self.max_items):
                items, fut = self._queue.pop(0)
                group.append((items, fut))
                n += len(items)
            flat = [x for items, _ in group for x in items]
            try:
                if self.compute_lock is None:
                    results = await asyncio.to_thread(self.fn, flat)
                else:
                    async with self.compute_lock:
                        results = await asyncio.to_thread(self.fn, flat)
            except Exception as exc:  # noqa: BLE001 - handed to every waiting submitter
                for _, fut in group:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            pos = 0
            for items, fut in group:
                if not fut.done():
                    fut.set_result(list(results[pos: pos + len(items)]))
                pos += len(items)

    async def aclose(self) -> None:
        """Stop the worker."""
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)


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
