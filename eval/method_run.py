"""One method of a QA evaluation, resumable: memories → index → retrieval → answers (+ support) → clarity.

Everything a method produces lives in ``<run>/eval/methods/<method>/`` (``memories.jsonl``, ``calibration.json``,
``index.db`` + ``index.json``, ``answers.jsonl``, ``clarity.json``, ``stickiness.json``, ``state.json``,
``cost.json``), each reused while what it was made from is unchanged, so a rerun or a crash repeats no finished
work. Details: docs/EVALUATION.md (The QA comparison: ``memreader eval``).
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memreader.core.errors import MemReaderError
from memreader.core.generation import GenerationParams
from memreader.core.paths import sha256_file, write_json
from memreader.core.schema import DocumentMemory, read_memories, write_memories
from memreader.eval.answering import (
    AnswerPass,
    ForwardTimer,
    GenerationProfile,
    answer_and_support,
    answer_messages,
    fit_chunks,
)
from memreader.eval.costs import CostLedger
from memreader.eval.suites import EvalSet
from memreader.retrieval.index import INDEX_FORMAT, MemoryIndex


class StaleRunError(MemReaderError, ValueError):
    """A run folder holds answers made with other settings than the ones given now."""


@dataclass
class MethodContext:
    """What every method of one run shares: settings, the loaded models, the profile."""

    out_dir: Path
    eval_set: EvalSet
    answer_settings: dict[str, Any]  # everything that shapes an answer besides the memories (state.json)
    top_k: int
    mode: str
    max_new_tokens: int
    answer_batch: int
    answerer: Any
    embedder: Any
    embedder_name: str
    profile: GenerationProfile
    support_fn: Callable[[list[str], list[list[str]], list[str]], list[dict[str, Any]]] | None = None
    clarity_fn: Callable[[list[DocumentMemory]], dict[str, Any]] | None = None
    clarity_signature: str = ""
    stickiness_fn: Callable[[list[DocumentMemory]], dict[str, Any]] | None = None
    stickiness_signature: str = ""


def has_layers(memories: list[DocumentMemory]) -> bool:
    """Whether any scenario has an outline topic or a core (chunk-only methods have neither)."""
    return any(s.outline.strip() or s.core.strip() for m in memories for s in m.scenarios)


def _read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _index(ctx: MethodContext, mdir: Path, memories: list[DocumentMemory], memories_sha: str) -> MemoryIndex:
    """The method's index, rebuilt only when its memories, the embedder or the index format changed."""
    manifest = {"memories_sha256": memories_sha, "embedder": ctx.embedder_name, "format": INDEX_FORMAT}
    db = mdir / "index.db"
    if _read_json(mdir / "index.json") == manifest and db.exists():
        return MemoryIndex.open(db, embedder=ctx.embedder, embedder_name=ctx.embedder_name)
    (mdir / "index.json").unlink(missing_ok=True)
    index = MemoryIndex(db, embedder=ctx.embedder)
    index.build(memories, ctx.embedder, embedder_name=ctx.embedder_name, progress=False)
    write_json(mdir / "index.json", manifest)
    return index


def _answered(path: Path) -> dict[str, dict[str, Any]]:
    """Finished answers by question id; a torn last line (a crash mid-write) is dropped and redone."""
    done: dict[str, dict[str, Any]] = {}
    if not path.is_file():
        return done
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise MemReaderError(f"{path}:{i + 1} is not JSON; the answers file is damaged: delete it to answer "
                                 "that method again") from None
        done[row["id"]] = row
    return done


def _rewrite_valid(path: Path, done: dict[str, dict[str, Any]]) -> None:
    """Drop a torn last line before appending (so the file stays one JSON object per line)."""
    if path.is_file():
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in done.values())
        if path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")


def _check_state(mdir: Path, state: dict[str, Any], method: str) -> None:
    old = _read_json(mdir / "state.json")
    if old is not None and old != state:
        changed = sorted(k for k in {*old, *state} if old.get(k) != state.get(k))
        raise StaleRunError(f"{mdir} holds {method} answers made with other settings ({', '.join(changed)} changed); "
                            "pick another run name, or delete that folder to answer again")
    write_json(mdir / "state.json", state)


def _scorer(ctx: MethodContext, batch: list[Any], contexts: list[list[str]]
            ) -> Callable[[list[int]], list[dict[str, Any]]] | None:
    """The support of the reference answers of ``batch[i]`` for the given ``i`` (None: support is off)."""
    fn = ctx.support_fn
    if fn is None:
        return None
    return lambda idx: fn([batch[i].question for i in idx], [contexts[i] for i in idx], [batch[i].answers[0] for i in idx])


def _save_answers(fh: Any, method: str, done: dict[str, dict[str, Any]], batch: list[Any], hits: list[Any],
                  fitted: list[tuple[list[str], int]], got: AnswerPass, idx: list[int]) -> None:
    """Append the rows of ``batch[i]`` for ``i`` in ``idx`` to answers.jsonl, durably (called as each cache group
    of :func:`memreader.eval.answering.answer_and_support` finishes: a kill loses at most the group in flight)."""
    for i in idx:
        q, hs, (kept, cut), sup = batch[i], hits[i], fitted[i], got.support[i] or {}
        if cut:
            print(f"eval: {method}: WARNING: question {q.id}: the {cut} lowest-ranked of {len(hs)} chunks do "
                  "not fit the answering model's window and were left out of its prompt", flush=True)
        row = {"id": q.id, "question": q.question, "answers": q.answers, "prediction": str(got.replies[i]).strip(),
               "retrieved": [h.to_dict() for h in hs], "chunks_left_out": cut, "context_chars": sum(map(len, kept)),
               "support_nll": sup.get("nll"), "support_tokens": sup.get("n_tokens"),
               "support_truncated": sup.get("truncated")}
        done[q.id] = row
        fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    fh.flush()
    os.fsync(fh.fileno())


def answer_questions(ctx: MethodContext, method: str, mdir: Path, index: MemoryIndex, mode: str) -> list[dict[str, Any]]:
    """Retrieve, answer and (optionally) score the support of every question not answered yet."""
    path = mdir / "answers.jsonl"
    done = _answered(path)
    _rewrite_valid(path, done)
    todo = [q for q in ctx.eval_set.questions if q.id not in done]
    params = GenerationParams(temperature=0.0, top_p=1.0, max_new_tokens=ctx.max_new_tokens)
    model = getattr(ctx.answerer, "model", None)
    with path.open("a", encoding="utf-8") as fh:
        for lo in range(0, len(todo), ctx.answer_batch):
            batch = todo[lo: lo + ctx.answer_batch]
            t0 = time.perf_counter()
            hits = [index.search(q.question, top_k=ctx.top_k, mode=mode) for q in batch]
            ctx.profile.add("retrieval", time.perf_counter() - t0)
            fitted = [fit_chunks(ctx.answerer, q.question, [h.text for h in hs], ctx.max_new_tokens)
                      for q, hs in zip(batch, hits, strict=True)]
            contexts = [kept for kept, _ in fitted]
            prompts = [answer_messages(q.question, c) for q, c in zip(batch, contexts, strict=True)]
            timer = ForwardTimer(model()) if callable(model) else None
            save = functools.partial(_save_answers, fh, method, done, batch, hits, fitted)
            got = answer_and_support(ctx.answerer, prompts, params, _scorer(ctx, batch, contexts), timer, on_done=save)
            ctx.profile.add_generation(got.generate_s, timer, len(batch))
            if ctx.support_fn is not None:
                ctx.profile.add("support", got.support_s)
            print(f"eval: {method}: {len(done)}/{len(ctx.eval_set.questions)} questions answered", flush=True)
    return [done[q.id] for q in ctx.eval_set.questions]


def _cached(ctx: MethodContext, path: Path, fn: Callable[[list[DocumentMemory]], dict[str, Any]] | None,
            signature: str, memories: list[DocumentMemory], memories_sha: str, cost: CostLedger
            ) -> dict[str, Any] | None:
    """``fn(memories)``, kept in ``path`` and reused while the memories and the signature are the same; the work
    (not a reuse) is timed as the phase named after the file."""
    if fn is None:
        return None
    cached = _read_json(path)
    key = {"memories_sha256": memories_sha, "signature": signature}
    if cached is not None and cached.get("key") == key:
        return cached["value"]
    t0 = time.perf_counter()
    with cost.phase(path.stem):
        value = fn(memories)
    ctx.profile.add(path.stem, time.perf_counter() - t0)
    write_json(path, {"key": key, "value": value})
    return value


def run_method(ctx: MethodContext, method: str, make_memories: Callable[[Path], tuple[list[DocumentMemory], Any]]
               ) -> dict[str, Any]:
    """Everything for one method; ``make_memories(work_dir)`` gives its memories and calibration record."""
    mdir = ctx.out_dir / "methods" / method
    mdir.mkdir(parents=True, exist_ok=True)
    with CostLedger(mdir / "cost.json") as cost:
        result = _run_method(ctx, method, make_memories, mdir, cost)
    return {**result, "cost": cost.to_dict()}


def _run_method(ctx: MethodContext, method: str, make_memories: Callable[[Path], tuple[list[DocumentMemory], Any]],
                mdir: Path, cost: CostLedger) -> dict[str, Any]:
    t_start = time.perf_counter()
    mem_path, cal_path = mdir / "memories.jsonl", mdir / "calibration.json"
    if mem_path.is_file() and cal_path.is_file():
        memories, calibration = read_memories(mem_path), _read_json(cal_path)
        print(f"eval: {method}: reusing {len(memories)} memories from {mem_path}")
    else:
        t0 = time.perf_counter()
        with cost.phase("memories"):
            memories, cal = make_memories(mdir / "work")
        calibration = cal.to_dict() if hasattr(cal, "to_dict") else dict(cal)
        missing = sorted(set(ctx.eval_set.documents) - {m.doc_id for m in memories})
        if missing:
            raise MemReaderError(f"{method} produced no memory for {len(missing)} document(s) ({', '.join(missing[:5])})"
                                 "; see the chunker's messages above")
        write_memories(mem_path, memories)
        write_json(cal_path, calibration)
        ctx.profile.add("memories", time.perf_counter() - t0)
    memories_sha = sha256_file(mem_path)
    _check_state(mdir, {**ctx.answer_settings, "memories_sha256": memories_sha}, method)
    mode = ctx.mode if has_layers(memories) else "chunk_only"
    done = _answered(mdir / "answers.jsonl")
    if all(q.id in done for q in ctx.eval_set.questions):
        # every question is answered (e.g. a run restored from a checkpoint, eval/checkpoint.py): the index
        # is not needed, and not rebuilt
        rows = [done[q.id] for q in ctx.eval_set.questions]
        print(f"eval: {method}: all {len(rows)} questions already answered in {mdir / 'answers.jsonl'}; "
              "no index needed")
    else:
        t0 = time.perf_counter()
        with cost.phase("index"):
            index = _index(ctx, mdir, memories, memories_sha)
        ctx.profile.add("index", time.perf_counter() - t0)
        with index, cost.phase("answers"):
            rows = answer_questions(ctx, method, mdir, index, mode)
    clarity = _cached(ctx, mdir / "clarity.json", ctx.clarity_fn, ctx.clarity_signature, memories, memories_sha,
                      cost)
    stickiness = _cached(ctx, mdir / "stickiness.json", ctx.stickiness_fn, ctx.stickiness_signature, memories,
                         memories_sha, cost)
    return {"memories": memories, "rows": rows, "mode": mode, "calibration": calibration, "clarity": clarity,
            "stickiness": stickiness, "seconds": round(time.perf_counter() - t_start, 1)}
