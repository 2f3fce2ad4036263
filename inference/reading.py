"""The documents a reading run has in flight (:class:`Reading`): planned, asked through a stream
(:mod:`memreader.core.generation.stream`), each written the moment it is done.
Details: docs/ENGINES.md (Reading keeps the engine full).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any

from memreader.core.assemble import memory_from_output
from memreader.core.corpus import Document
from memreader.core.generation import GenerationParams, GenerationRequestError
from memreader.core.generation.stream import Stream, StreamRequest
from memreader.core.guidance import longer_budget, plan_guided_windows, settle_reply
from memreader.core.language import detect_language
from memreader.core.structure import annotate, structural_breaks
from memreader.core.windowing import merge_window_memories

log = logging.getLogger(__name__)


@dataclass
class Tally:
    """What a run counts across its documents."""

    failed: dict[str, str] = dc_field(default_factory=dict)
    stats: dict[str, Any] = dc_field(default_factory=lambda: {
        "fallbacks": 0, "repaired": 0, "merged_scenarios": 0, "coverage_exact_sum": 0.0, "guided": 0,
        "unguided": 0, "windowed": 0, "windows": 0, "asked_again": 0})
    single_chunk: list[str] = dc_field(default_factory=list)
    fates: list[str] = dc_field(default_factory=list)  # one per document asked
    memory_limit: dict[str, int] | None = None  # Reading.memory_limit of the run
    cut_head: dict[str, Any] | None = None  # the cut head the run read with (Cutter.describe), None: none

    def count(self, doc_id: str, mem: Any, n_windows: int, single_chunk: bool) -> None:
        stats = self.stats
        if n_windows > 1:
            stats["windowed"] += 1
            stats["windows"] += n_windows
        stats["fallbacks"] += "fallback" in mem.meta
        stats["repaired"] += bool(mem.meta.get("parse_diagnostics"))
        stats["merged_scenarios"] += mem.meta.get("alignment", {}).get("merged", 0)
        stats["coverage_exact_sum"] += mem.meta.get("alignment", {}).get("coverage_exact", 0.0)
        stats["guided" if mem.meta["generation"]["guided"] else "unguided"] += 1
        if single_chunk:
            self.single_chunk.append(doc_id)


class Reading:
    """Documents in flight: :meth:`plan` one, :meth:`add` it once it :meth:`fits`, :meth:`step` for those finished.

    ``capacity_tokens`` (0: not known): the KV cache the engine can hold; a document goes in only while the tokens
    its requests may reach (prompt + reply budget) fit beside those in flight, so a ``batch_size`` larger than
    memory holds runs with fewer requests at once (:attr:`memory_limit` says how many, for the run's message)
    instead of running out of memory."""

    def __init__(self, cfg: Any, key: str, prompt: Any, grammars: Any, sizing: dict[str, Any],
                 params: GenerationParams, stream: Stream, tally: Tally, capacity_tokens: int = 0,
                 prompt_tokens: Callable[[Any], int] | None = None, cutter: Callable[[str], Any] | None = None) -> None:
        self.cfg, self.key, self.prompt, self.grammars, self.sizing = cfg, key, prompt, grammars, sizing
        self.params, self.stream, self.tally = params, stream, tally
        self.capacity, self._prompt_tokens = capacity_tokens, prompt_tokens
        self.reserved = 0  # tokens the requests in flight may reach
        self.memory_limit: dict[str, int] | None = None  # set when memory, not the window, held a document back
        self.cutter = cutter  # text -> (the cut head's breaks, their record for meta.cuts); None: no head

    @property
    def pending(self) -> int:
        return self.stream.pending

    def plan(self, doc: Document, cuts: tuple[list[int], dict[str, Any] | None] | None = None) -> _InFlight | None:
        """``doc``'s windows, grammars and prompts; None (counted as failed, named with the fix) when no guided memory
        fits it. ``cuts``: the cut head's result for ``doc`` when already scored (:func:`cut_ahead`)."""
        if cuts is None:
            cuts = self.cutter(doc.text) if self.cutter is not None else ([], None)
        flight = _InFlight(self.cfg, doc, self.key, self.prompt, self.grammars, self.sizing, cuts)
        if flight.refused:
            self.tally.failed[doc.doc_id] = flight.refused
            log.warning("doc %s: no guided memory possible: %s", doc.doc_id, flight.refused)
            return None
        if self.capacity and self._prompt_tokens is not None:
            flight.prompt_tokens = [self._prompt_tokens(messages) for messages, _ in flight.rendered]
        return flight

    def fits(self, flight: _InFlight) -> bool:
        """True when ``flight`` may go in now: nothing is in flight, or the window has room and, where the cache's
        size is known, its requests' tokens fit beside the others'."""
        if self.stream.pending == 0:
            return True
        if self.stream.pending >= self.stream.window:
            return False
        need = sum(flight.prompt_tokens) + len(flight.rendered) * self.params.max_new_tokens
        if self.capacity and self.reserved + need > self.capacity:
            if self.memory_limit is None or self.stream.pending < self.memory_limit["in_flight"]:
                self.memory_limit = {"in_flight": self.stream.pending, "capacity_tokens": self.capacity,
                                     "tokens_per_request": need // len(flight.rendered)}
            return False
        return True

    def add(self, flight: _InFlight) -> None:
        """Put ``flight``'s windows into the stream."""
        for k in range(len(flight.rendered)):
            self._submit(flight, k, self.params, retried=False)

    def step(self) -> list[tuple[Document, Any]]:
        """Run the engine until replies come in; each document whose windows are all settled, with its memory (None:
        not written — failed, or cut off and skipped)."""
        done = []
        for (flight, k, retried), reply in self.stream.step():
            self.reserved -= flight.reserved.pop(k)
            reply, fate = settle_reply(reply, self.cfg.on_truncated, retried)
            if fate == "again":
                self.tally.stats["asked_again"] += 1
                log.warning("doc %s: reply hit max_new_tokens=%d; asking again with %d", flight.doc.doc_id,
                            self.params.max_new_tokens, longer_budget(self.params).max_new_tokens)
                self._submit(flight, k, longer_budget(self.params), retried=True)
                continue
            flight.outputs[k], flight.fates[k] = reply, fate
            if len(flight.outputs) == len(flight.rendered):
                done.append((flight.doc, flight.memory(self.tally)))
        return done

    def _submit(self, flight: _InFlight, k: int, params: GenerationParams, retried: bool) -> None:
        flight.reserved[k] = flight.prompt_tokens[k] + params.max_new_tokens if flight.prompt_tokens else 0
        self.reserved += flight.reserved[k]
        self.stream.submit(StreamRequest((flight, k, retried), flight.rendered[k][0], params, flight.grammar(k)))


class _InFlight:
    """One document: its windows and grammars planned, its replies as they come, its memory once all are in."""

    def __init__(self, cfg: Any, doc: Document, key: str, prompt: Any, grammars: Any, sizing: dict[str, Any],
                 cuts: tuple[list[int], dict[str, Any] | None] = ([], None)) -> None:
        self.cfg, self.doc, self.key = cfg, doc, key
        self.cuts = cuts[1]  # the cut head's scores, kept in meta.cuts
        # heading and page starts, and the ends the cut head gives a topic change: preferred chunk ends
        breaks = sorted({*structural_breaks(doc.meta), *cuts[0]})
        self.wplan, self.plans, plan_errors = plan_guided_windows([doc.text], grammars, cfg.max_new_tokens,
                                                                  [breaks] if breaks else None, **sizing)
        self.windows = self.wplan.windows[0] if self.wplan.windows else []
        self.refused = self.wplan.errors.get(0, "")
        if not self.refused and plan_errors:
            j, error = min(plan_errors.items())
            self.refused = error if len(self.windows) == 1 else (f"window {self.windows[j].index} "
                                                                 f"[{self.windows[j].start}, {self.windows[j].end}): "
                                                                 f"{error}")
        self.window_texts = self.wplan.texts([doc.text]) if not self.refused else []
        lang = detect_language(doc.text)
        self.rendered = [prompt.render(lang, text) for text in self.window_texts]
        self.outputs: dict[int, Any] = {}
        self.fates: dict[int, str] = {}
        self.prompt_tokens: list[int] = []  # per window, where the reader plans on the KV cache's size
        self.reserved: dict[int, int] = {}  # per window in flight: the tokens it may reach

    def grammar(self, k: int) -> str | None:
        return self.plans[k].lark if self.plans[k] is not None else None

    def memory(self, tally: Tally) -> Any:
        """The document's memory from its windows, or None when it is not written (failed or cut off)."""
        doc, ks = self.doc, range(len(self.rendered))
        errors = [(self.windows[k], self.outputs[k]) for k in ks if isinstance(self.outputs[k], GenerationRequestError)]
        if errors:  # not written: the next run asks again
            w, error = errors[0]
            tally.failed[doc.doc_id] = str(error) if len(self.windows) == 1 else f"window {w.index}: {error}"
            log.warning("doc %s: request failed for good (%s)", doc.doc_id, tally.failed[doc.doc_id])
            tally.fates.append("error")
            return None
        doc_fates = [self.fates[k] for k in ks]
        fate = next((f for f in ("truncated-skipped", "truncated-kept", "retried") if f in doc_fates), "ok")
        tally.fates.append(fate)
        if fate == "truncated-skipped":  # not written: the next run asks again
            log.warning("doc %s: reply cut off at the token budget; skipped (on_truncated=%s)", doc.doc_id,
                        self.cfg.on_truncated)
            return None
        cfg = self.cfg
        meta = {"model": cfg.model, "adapter": cfg.adapter or None, "prompt": self.rendered[0][1].id,
                "backend": cfg.backend, "dtype": cfg.dtype, "source_sha256": doc.sha256, "read_key": self.key,
                **({"cuts": self.cuts} if self.cuts is not None else {})}
        one = len(self.windows) == 1
        parts = [self._part(k, meta, one) for k in ks]
        if one:
            mem = parts[0]
        else:
            mem = merge_window_memories(doc.doc_id, doc.text, self.windows, parts, {
                **meta, "windowing": {"budget_tokens": self.wplan.budget, "overlap_tokens": cfg.overlap_tokens}})
        annotate(mem, doc.meta)  # pages and headings of each scenario, when memreader ingest mapped them
        tally.count(doc.doc_id, mem, len(self.windows),
                    all(self.plans[k] is not None and self.plans[k].single_chunk for k in ks))
        return mem

    def _part(self, k: int, meta: dict[str, Any], one: bool) -> Any:
        """The memory of window ``k`` (the document's own memory when it is read whole)."""
        out, plan, w = self.outputs[k], self.plans[k], self.windows[k]
        part: dict[str, Any] = {"generation": {**out.info(), "fate": self.fates[k],
                                               "grammar": plan.meta() if plan else None}}
        if self.fates[k] == "truncated-kept":
            part["truncated"] = True
        return memory_from_output(self.doc.doc_id if one else f"{self.doc.doc_id}#w{w.index}", self.window_texts[k],
                                  out, {**meta, **part} if one else part, "whole", self.cfg.fuzzy_threshold,
                                  plan.graph if plan is not None and out.guided else None)


def cut_ahead(docs: Iterator[Document], cutter: Callable[[str], Any] | None,
              depth: int = 2) -> Iterator[tuple[Document, Any]]:
    """``docs`` with the cut head's result for each, scored ``depth`` documents ahead in one worker thread, so that
    the head's prefill runs while the engine generates the documents already in flight (torch and the engine both
    leave the GIL during their kernels). Without a head: ``(doc, None)``. An error in the head surfaces at its
    document. ``depth`` 0: no thread (each document is scored by :meth:`Reading.plan`)."""
    if cutter is None or depth == 0:
        yield from ((doc, None) for doc in docs)
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    pending: deque[tuple[Document, Any]] = deque()
    with ThreadPoolExecutor(1, thread_name_prefix="cut-head") as pool:
        try:
            for doc in docs:
                pending.append((doc, pool.submit(cutter, doc.text)))
                if len(pending) > depth:
                    doc, future = pending.popleft()
                    yield doc, future.result()
            while pending:
                doc, future = pending.popleft()
                yield doc, future.result()
        finally:
            for _, future in pending:
                future.cancel()

