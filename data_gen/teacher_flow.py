"""One document's way through the teacher: outline → N candidates → scoring → RRF selection → CoM.

Every document (or window of a long one: a *unit*) runs as its own coroutine (:mod:`memreader.data_gen.flow`);
candidates, scores and the reasoning path are cached, so a crash loses none. Details: docs/ARCHITECTURE.md
(The teacher flow).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from memreader.core.assemble import memory_from_output
from memreader.core.corpus import Document
from memreader.core.generation import GenerationParams, GenerationRequestError, Reply
from memreader.core.guidance import ask_with_policy, longer_budget
from memreader.core.markup import render_memory
from memreader.core.parser import ParseError
from memreader.core.prompts import render
from memreader.core.schema import DocumentMemory
from memreader.data_gen.cache import ScoreCache
from memreader.data_gen.cached_teacher import CachedTeacher
from memreader.data_gen.flow import Batcher
from memreader.data_gen.selection import select_candidates

log = logging.getLogger(__name__)


@dataclass
class Unit:
    """What the teacher reads at once: a whole document, or one window of a long one."""

    doc: Document
    unit_id: str
    text: str
    lang: str
    plan: Any = None  # GrammarPlan or None (unguided)
    window: Any = None  # memreader.core.windowing.Window, or None for a whole document


@dataclass
class UnitResult:
    """What became of one unit: its winning memory (or None), every candidate's row, failures, fates."""

    unit: Unit
    memory: DocumentMemory | None = None
    candidates: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, str]] = field(default_factory=list)
    fates: list[str] = field(default_factory=list)
    candidate_failures: list[dict[str, Any]] = field(default_factory=list)

    def fail(self, stage: str, error: Exception | str) -> None:
        self.failures.append({"doc_id": self.unit.unit_id, "stage": stage, "error": str(error)})
        log.warning("%s: %s failed (%s)", self.unit.unit_id, stage, error)

    def candidate_failed(self, j: int, stage: str, error: Exception | str) -> None:
        """One candidate failed; the unit fails only when every candidate did (see :meth:`TeacherFlow.run`)."""
        self.candidate_failures.append({"doc_id": self.unit.unit_id, "stage": stage, "candidate": j,
                                        "error": str(error)})
        log.info("%s: candidate %d: %s failed (%s)", self.unit.unit_id, j, stage, error)


def outline_lines(reply: str) -> list[str]:
    """Outline topics from an outline reply; tolerant of a missing tag."""
    text = reply.split("<outline>", 1)[1].split("</outline>", 1)[0] if "<outline>" in reply else reply
    return [ln for ln in (line.strip(" -*•\t") for line in text.splitlines()) if ln and not ln.startswith("<")]


NOT_RANKED = {"clarity": None, "completeness": None, "rank_clarity": None, "rank_completeness": None, "rrf": None}
"""The selection columns of a candidate that was not scored."""


def candidate_row(unit: Unit, mem: DocumentMemory, selection: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """One row of ``candidates.jsonl``: the candidate (``meta["candidate"]``; the structure teacher's only one is 0),
    its ``selection`` columns (scores, ranks, RRF, ``selected``) and its chunks."""
    return {"doc_id": unit.doc.doc_id, "unit_id": unit.unit_id, "candidate": mem.meta.get("candidate", 0),
            **selection, "scenarios": len(mem.scenarios), "spans": [[s.start, s.end] for s in mem.scenarios],
            "outline": mem.outline, "fate": mem.meta["generation"]["fate"], **extra}


class TeacherFlow:
    """Runs units through the five steps; ``cfg`` is a :class:`memreader.data_gen.pipeline.GenConfig`."""

    def __init__(self, cfg: Any, teacher: CachedTeacher, scorer: Any, score_cache: ScoreCache,
                 bars: dict[str, Any], compute_lock: asyncio.Lock | None = None) -> None:
        self.cfg, self.teacher, self.scorer, self.score_cache, self.bars = cfg, teacher, scorer, score_cache, bars
        self.templates: dict[str, str] = {}
        self.outline_params = GenerationParams(cfg.temperature, cfg.top_p, cfg.outline_max_new_tokens, seed=cfg.seed)
        self.extract_params = GenerationParams(cfg.temperature, cfg.top_p, cfg.max_new_tokens, seed=cfg.seed)
        self.com_params = GenerationParams(cfg.temperature, cfg.top_p, cfg.com_max_new_tokens, seed=cfg.seed)
        self.score_batcher = Batcher(self._score_now, max_items=max(8, cfg.score_batch_memories),
                                     compute_lock=compute_lock)
        self.scored_now = 0  # memories the evaluator scored in this run (the rest came from the cache)
        # reverse-CoM probe (cfg.com_probe): the first requests go alone; the gate opens when one ends its reasoning,
        # or closes the step for good when every probe was cut off at its budget
        self.com_probes_left = cfg.com_probe
        self.com_probe_fates: list[str] = []
        self.com_gate = asyncio.Event()
        self.com_given_up = False
        if not self.com_probes_left:
            self.com_gate.set()

    def _item(self, name: str, lang: str, **values: Any) -> tuple[str, list[dict[str, str]]]:
        msgs, tpl = render(name, lang, **values)
        self.templates[tpl.id] = tpl.version
        return tpl.id, msgs

    async def run(self, unit: Unit) -> UnitResult:
        """All steps for one unit. A failed request or an unusable reply is recorded on the result (the
        unit fails only when every candidate did); an evaluator error (bad settings, a tokenizer
        without the answer words) stops the run, with every reply and score so far already cached."""
        res = UnitResult(unit)
        cfg = self.cfg
        item = self._item("teacher_outline", unit.lang, document=unit.text, min_parts=cfg.min_parts,
                          max_parts=cfg.max_parts)
        reply = await self.teacher.ask(item, self.outline_params)
        self.bars["outline"].update(1)
        if isinstance(reply, GenerationRequestError):
            res.fail("outline request", reply)
            return res
        outline = outline_lines(reply)
        extract = self._item("teacher_extraction", unit.lang, document=unit.text, outline="\n".join(outline) or "-")
        grammar = unit.plan.lark if unit.plan is not None else None
        cands = await asyncio.gather(*(self._candidate(unit, extract, grammar, j, res)
                                       for j in range(cfg.num_candidates)))
        memories = [m for m in cands if m is not None]
        competing = [m for m in memories if "fallback" not in m.meta and not m.meta.get("truncated")]
        pool = competing or [m for m in memories if m.meta.get("truncated")] or memories
        if not pool:  # every candidate failed: the unit fails with each candidate's reason
            for f in res.candidate_failures:
                res.fail(f["stage"], f["error"] if cfg.num_candidates == 1 else f"candidate {f['candidate']}: {f['error']}")
            return res
        scores: list[dict[str, Any] | None] = [None] * len(pool)
        if cfg.num_candidates > 1 and len(competing) > 1:
            scores = await self._scores(pool)
        self.bars["scoring"].update(1)
        rows = select_candidates([{"clarity": (s or {}).get("clarity"), "completeness": (s or {}).get("completeness")}
                                  for s in scores], cfg.rrf_k) if scores[0] is not None else \
            [{**NOT_RANKED, "selected": i == 0} for i in range(len(pool))]
        res.candidates += [candidate_row(unit, mem, {**row, "scores": score})
                           for mem, row, score in zip(pool, rows, scores, strict=True)]
        in_pool = {id(m) for m in pool}
        res.candidates += [candidate_row(unit, mem, {**NOT_RANKED, "selected": False, "scores": None},
                                         excluded="whole-document fallback" if "fallback" in mem.meta else
                                         "cut off (kept flagged)") for mem in memories if id(mem) not in in_pool]
        res.candidates.sort(key=lambda r: r["candidate"])
        w = next(i for i, r in enumerate(rows) if r["selected"])
        winner = pool[w]
        winner.meta["selection"] = {"candidates": cfg.num_candidates, "usable": len(competing), **rows[w],
                                    "scores": scores[w]}
        if cfg.reverse_com:
            await self._reasoning(winner, unit)
        self.bars["com"].update(1)
        res.memory = winner
        return res

    async def _candidate(self, unit: Unit, item: tuple[str, list[dict[str, str]]], grammar: str | None, j: int,
                         res: UnitResult) -> DocumentMemory | None:
        cfg = self.cfg

        async def ask(p: GenerationParams) -> Reply | GenerationRequestError:
            return await self.teacher.ask(item, p, grammar, sample=j)

        reply, fate = await ask_with_policy(ask, self.extract_params, cfg.on_truncated)
        self.bars["candidates"].update(1)
        res.fates.append(fate)
        if fate == "error":
            res.candidate_failed(j, "extraction request", reply)
            return None
        if fate == "truncated-skipped":
            res.candidate_failed(j, "extraction reply", f"cut off at the token budget (on_truncated={cfg.on_truncated}); "
                     "raise max_new_tokens, then rerun with retry_unusable=true")
            return None
        meta = {"model": cfg.model, "prompt": item[0], "candidate": j, "source_sha256": unit.doc.sha256,
                "generation": {**reply.info(), "fate": fate, "grammar": unit.plan.meta() if unit.plan else None}}
        if fate == "truncated-kept":
            meta["truncated"] = True
        # the params the kept reply was asked with (a retried reply had twice the budget)
        used = self.extract_params if fate != "retried" else longer_budget(self.extract_params)
        try:
            mem = memory_from_output(unit.unit_id, unit.text, reply, meta, "whole" if cfg.on_unusable == "whole" else "raise",
                                     graph=unit.plan.graph if unit.plan is not None and reply.guided else None)
        except ParseError as exc:
            self.teacher.mark_unusable(item, used, grammar, j)
            res.candidate_failed(j, "extraction reply", exc)
            return None
        if "fallback" in mem.meta:
            self.teacher.mark_unusable(item, used, grammar, j)
        return mem

    def _score_now(self, memories: list[DocumentMemory]) -> list[dict[str, Any]]:
        """Runs in a worker thread: one batched scorer call over every memory waiting."""
        scores = self.scorer.score(memories)
        self.scored_now += len(memories)
        return [s.to_dict() for s in scores]

    async def _scores(self, memories: list[DocumentMemory]) -> list[dict[str, Any]]:
        keys = [self.score_cache.key(m, self.scorer) for m in memories]
        out: list[dict[str, Any] | None] = [self.score_cache.get(k) for k in keys]
        todo = [i for i, s in enumerate(out) if s is None]
        if todo:
            fresh = await self.score_batcher.submit([memories[i] for i in todo])
            for i, score in zip(todo, fresh, strict=True):
                self.score_cache.put(keys[i], score)  # stored at once: a crash loses no scored candidate
                out[i] = score
        return out  # type: ignore[return-value]

    async def _reasoning(self, mem: DocumentMemory, unit: Unit) -> None:
        cfg = self.cfg
        probing = not self.com_gate.is_set() and self.com_probes_left > 0
        if probing:
            self.com_probes_left -= 1
        elif not self.com_gate.is_set():
            await self.com_gate.wait()
        if self.com_given_up:
            mem.meta["reverse_com_error"] = (f"not asked: the teacher's first {cfg.com_probe} reasoning paths were all "
                                             "cut off at their token budget (com_probe)")
            mem.meta["reverse_com"] = {"fate": "not-asked", "max_new_tokens": None, "completion_tokens": None}
            return
        try:
            await self._ask_reasoning(mem, unit)
        except BaseException:
            if probing:  # the units waiting on this probe are not left waiting: they ask for themselves
                self.com_gate.set()
            raise
        if probing:
            self._probe_settled(mem.meta["reverse_com"]["fate"], mem.meta["reverse_com"]["max_new_tokens"])

    def _probe_settled(self, fate: str, budget: int) -> None:
        """One probe's fate: a reasoning that ended (or a failed request, which says nothing of the teacher) opens
        the gate; the last of ``com_probe`` probes all cut off closes the step for the rest of the run, loudly."""
        self.com_probe_fates.append(fate)
        if fate != "truncated-skipped":
            self.com_gate.set()
        elif len(self.com_probe_fates) == self.cfg.com_probe:
            self.com_given_up = True
            self.com_gate.set()
            log.warning("reverse CoM: the teacher's first %d reasoning paths were all cut off at %d tokens; the "
                        "other documents' are not asked (com_probe=%d; 0 asks every one, or raise com_max_new_tokens "
                        "or use a stronger teacher)", self.cfg.com_probe, budget, self.cfg.com_probe)

    async def _ask_reasoning(self, mem: DocumentMemory, unit: Unit) -> None:
        cfg = self.cfg
        target = render_memory(mem.outline, mem.chunks, mem.cores, None, cfg.head_chars, cfg.tail_chars)
        item = self._item("reverse_com", unit.lang, document=unit.text, memory=target)

        async def ask(p: GenerationParams) -> Reply | GenerationRequestError:
            return await self.teacher.ask(item, p)

        # The reasoning is part of the SFT target: a cut-off one is never kept (keep_flagged counts as
        # skip here); retry_longer asks once more with twice com_max_new_tokens first.
        policy = "retry_longer" if cfg.on_truncated == "retry_longer" else "skip"
        reply, fate = await ask_with_policy(ask, self.com_params, policy)
        asked_twice = policy == "retry_longer" and fate in ("retried", "truncated-skipped")
        budget = self.com_params.max_new_tokens * (2 if asked_twice else 1)  # of the reply kept or refused
        if fate == "error":
            mem.meta["reverse_com_error"] = str(reply)  # kept without reasoning; counted in the manifest
            log.warning("%s: reverse CoM request failed, memory kept without reasoning (%s)", unit.unit_id, reply)
        elif fate == "truncated-skipped":
            mem.meta["reverse_com_error"] = (f"reasoning cut off at its token budget ({budget} tokens); left out of "
                                             "the SFT target")
            log.warning("%s: reverse CoM reply cut off at %d tokens (on_truncated=%s); memory kept without reasoning",
                        unit.unit_id, budget, cfg.on_truncated)
        else:
            text = reply.split("</think>")[-1].strip()  # R1-style teachers may wrap their own thinking
            mem.reasoning = text or None
            if not text:
                fate = "empty"
                mem.meta["reverse_com_error"] = "the reverse-CoM reply held no reasoning"
        # what became of the request, for the manifest's count (the demo reports it per fate)
        mem.meta["reverse_com"] = {"fate": fate, "max_new_tokens": budget,
                                   "completion_tokens": getattr(reply, "completion_tokens", None)}
