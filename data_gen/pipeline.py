"""Teacher-side data generation: outline → N candidates → evaluator scoring → RRF → reverse CoM → SFT records.

    memreader gen --config configs/data_gen/smollm2_local.yaml --set num_candidates=4
    python -m memreader.data_gen.pipeline --config configs/data_gen/openai_teacher.yaml --set input=corpus.jsonl

MoM's data construction: per document, an outline, then ``num_candidates`` candidate memories
(multi-path sampling, guided by the document's memory grammar where the backend takes one; see
:mod:`memreader.core.guidance`), each scored by an evaluator LM for atomic-chunk clarity and core-content
completeness (:mod:`memreader.core.scoring`), ranked and fused with RRF (:mod:`memreader.data_gen.selection`); the
winner gets its reasoning path (reverse CoM) and becomes an SFT record in TRL's conversational
prompt-completion format (loss on the completion only). Every document runs as its own coroutine
and asks for its next step as soon as its previous reply is in (:mod:`memreader.data_gen.teacher_flow`,
:mod:`memreader.data_gen.flow`), so an endpoint always has ``max_concurrency`` requests in flight. Every
teacher call and every score goes through a SQLite cache (candidates keyed by their sample index),
so a rerun or a resumed crash repeats no call and rescores nothing, and raising ``num_candidates``
pays only for the new candidates. Outputs: ``memories.jsonl`` (winners), ``candidates.jsonl``
(every candidate with its scores, ranks, RRF and ``selected``), SFT splits and ``manifest.json``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import closing
from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any, ClassVar

from tqdm.auto import tqdm

from memreader.core.config import field
from memreader.core.corpus import CorpusConfig, CorpusError, Document, read_corpus, split_empty
from memreader.core.engines import EngineKeys, device_field, dtype_field, make_engine
from memreader.core.errors import RunFailed
from memreader.core.fusion import rrf_k_field
from memreader.core.guidance import GuidedConfig, count_fates
from memreader.core.paths import run_dir, sha256_file, write_json, write_jsonl, write_resolved_config
from memreader.core.prompts import PromptConfig
from memreader.core.registry import SMOLLM2
from memreader.core.runlock import RunLock
from memreader.core.schema import write_memories
from memreader.core.scoring import evaluator_scorer
from memreader.core.scoring_settings import EvaluatorConfig
from memreader.core.stage import Stage
from memreader.core.windowing import WindowConfig
from memreader.data_gen.cache import ReplyCache, ScoreCache
from memreader.data_gen.cached_teacher import CachedTeacher
from memreader.data_gen.flow import Dispatcher, gather_bounded
from memreader.data_gen.sft_export import balance, sft_record, write_sft_splits
from memreader.data_gen.structure_teacher import structure_config, structure_results
from memreader.data_gen.teacher_flow import TeacherFlow, Unit, UnitResult
from memreader.data_gen.units import make_units, merge_units

log = logging.getLogger(__name__)

ENGINE = EngineKeys("teacher", backend="teacher", extra=("structure",))


@dataclass
class GenConfig(CorpusConfig, GuidedConfig, WindowConfig, PromptConfig, EvaluatorConfig):
    """Settings of one data-generation run (the guided-decoding, window, prompt and evaluator keys of its bases)."""

    RENAMED_KEYS: ClassVar[dict[str, str]] = {"score_batch_tokens": "evaluator_batch_tokens"}

    run: str = field("gen", help="run name: outputs go to $MEMREADER_HOME/runs/<run>/gen/")
    teacher: str = field("auto", help="teacher backend: transformers (in process; alias local), vllm (in-process "
                         "vLLM engine), openai (any OpenAI-compatible endpoint), auto (the fastest measured on this "
                         "machine, else vllm: docs/ENGINES.md), or structure (no model: the memory each document's "
                         "known sections imply, data_gen/structure_teacher.py; model = the reader's)")
    dtype: str = dtype_field("in-process teacher weights")
    device: str = device_field("teacher=transformers")
    model: str = field(SMOLLM2, help="teacher model name (registry name, folder or API model id)")
    base_url: str = field("", help="OpenAI-compatible base URL (else MEMREADER_TEACHER_BASE_URL)")
    max_concurrency: int = field(8, ge=1, help="parallel requests to an OpenAI-compatible teacher")
    batch_size: int = field(4, ge=1, help="documents per generate call for the local teacher")
    temperature: float = field(0.7, ge=0, help="sampling temperature (paper: 0.7)")
    top_p: float = field(0.8, gt=0, le=1, help="nucleus sampling (paper: 0.8)")
    max_new_tokens: int = field(768, ge=1, help="token budget of the extraction reply")
    outline_max_new_tokens: int = field(160, ge=1, help="token budget of the outline reply")
    seed: int = field(0, ge=0, help="sampling seed (part of the cache key)")
    min_parts: int = field(2, ge=1, help="fewest outline topics asked for")
    max_parts: int = field(6, ge=1, help="most outline topics asked for")
    reverse_com: bool = field(True, help="ask the teacher for the reasoning path (CoM) behind each memory")
    com_max_new_tokens: int = field(256, ge=1, help="token budget of the reverse-CoM reply")
    com_probe: int = field(2, ge=0, help="the run's first N reverse-CoM requests go alone; when every one of them is "
                           "cut off at its budget (a teacher that does not end a reasoning, e.g. a 135M model that "
                           "loops), the rest are not asked (fate 'not-asked', said in the output and the manifest); "
                           "0: ask every one")
    on_unusable: str = field("skip", help="a teacher reply with no chunk at all: 'skip' the document (no SFT "
                             "record), or keep it as a 'whole'-document one-chunk memory (flagged, counted, "
                             "warned about; only sensible for smoke runs with a weak teacher)")
    head_chars: int = field(12, ge=1, help="characters before [MASK] in SFT targets")
    tail_chars: int = field(12, ge=1, help="characters after [MASK] in SFT targets")
    val_fraction: float = field(0.1, ge=0, lt=1, help="share of documents held out for validation (at least one when >0)")
    split_seed: int = field(13, ge=0, help="seed of the train/validation split")
    retry_unusable: bool = field(False, help="ask the teacher again for cached replies that were cut off or unusable")
    num_candidates: int = field(3, ge=1, help="candidate memories sampled per document (MoM multi-path sampling); "
                                "the evaluator scores them and RRF keeps one. Raising it reuses cached candidates")
    rrf_k: float = rrf_k_field("candidate selection (the ranks by clarity and by completeness)")
    score_batch_memories: int = field(64, ge=1, help="most candidate memories scored in one scorer call")
    domain_field: str = field("", help="corpus field naming each document's domain, for balancing and the "
                              "stratified split (empty: one domain)")
    length_edges: list[int] = field([1000, 3000], help="document-length buckets (characters) for balancing and "
                                    "the stratified split")
    max_per_stratum: int = field(0, ge=0, help="most SFT records per (language, domain, length bucket); 0 keeps all")
    active_units: int = field(0, ge=0, help="documents in progress at once (0 = 4 x max_concurrency or 2 x batch_size)")
    def marker(self) -> dict[str, int]:
        """Chunk markers as in the SFT targets, at most max_parts chunks."""
        return {"head_chars": self.head_chars, "tail_chars": self.tail_chars, "max_scenarios": self.max_parts}

    def problems(self) -> list[str]:
        """Problems a config file can have beyond types."""
        problems = self.guided_problems(**self.marker()) + self.windows().problems() + self.prompt_problems()
        problems += self.corpus_problems()
        if self.on_unusable not in ("skip", "whole"):
            problems.append(f"on_unusable: {self.on_unusable!r} is not 'skip' or 'whole'")
        problems += ENGINE.problems(self)
        if self.max_parts < self.min_parts:
            problems.append(f"min_parts/max_parts: need min_parts <= max_parts, got {self.min_parts}/{self.max_parts}")
        return problems


def generate(cfg: GenConfig, scorer: Any = None) -> dict[str, Any]:
    """Run the pipeline; returns the manifest (also written to the run folder). One writer per run
    folder; a run in which every document failed raises :class:`RunFailed` (exit code 1).

    ``scorer`` (anything with ``score(memories)``, each score with ``clarity``, ``completeness`` and ``to_dict()``,
    and ``signature()``) ranks the candidates instead of the evaluator ``cfg`` names, when ``num_candidates`` > 1:
    a benchmark of the teacher flow alone (``scripts/bench_teacher_flow.py``) or a test, not for real data."""
    out_dir = run_dir(cfg.run, "gen")
    with RunLock(out_dir):
        return _generate(resolve_teacher(cfg), out_dir, scorer)


def resolve_teacher(cfg: GenConfig) -> GenConfig:
    """``cfg`` with ``teacher`` decided (:func:`memreader.core.engines.resolve_engine`, stage ``teacher``),
    ``transformers`` kept under its older name ``local`` (part of every cached reply's key)."""
    if cfg.teacher == "structure":
        return structure_config(cfg)
    choice = ENGINE.choice(cfg)
    teacher = "local" if choice.backend == "transformers" else choice.backend
    if teacher != cfg.teacher:
        log.info("gen: teacher backend %s (%s)", teacher, choice.why)
    return replace(cfg, teacher=teacher)


def _backend(cfg: GenConfig) -> tuple[Any, str]:
    """The teacher engine (:func:`memreader.core.engines.make_engine`) and, for a server, its URL."""
    backend = make_engine(ENGINE.choice(cfg), cfg.model, batch_size=cfg.batch_size, base_url=cfg.base_url,
                          max_concurrency=cfg.max_concurrency, guided=cfg.guided)
    if cfg.teacher != "openai":
        return backend, ""
    backend.check_reachable()
    return backend, backend.base_url or ""


def _generate(cfg: GenConfig, out_dir: Path, scorer: Any = None) -> dict[str, Any]:
    docs, empty = split_empty(read_corpus(cfg.input, cfg.id_field, cfg.text_field, cfg.limit or None))
    if not docs:
        raise cfg.no_text(empty)
    if empty:  # before any paid call
        log.warning("skipping %d document(s) with empty text: %s", len(empty), empty[:5])
    if cfg.domain_field:
        missing = [d.doc_id for d in docs if cfg.domain_field not in d.meta]
        if missing:
            raise CorpusError(f"{len(missing)} document(s) of {cfg.input} have no {cfg.domain_field!r} field (domain_field), "
                              f"e.g. {missing[:3]}", "add the field to every record, or set domain_field= (empty)")
    backend, base_url = _backend(cfg) if cfg.teacher != "structure" else (None, "")
    write_resolved_config(out_dir, cfg)  # after the checks: a refused run leaves the earlier record as it was
    db = out_dir / "teacher_cache.sqlite"
    with closing(ReplyCache(db)) as cache, closing(ScoreCache(db)) as score_cache:
        return _run(cfg, out_dir, docs, empty, backend, base_url, cache, score_cache, scorer)


def _run(cfg: GenConfig, out_dir: Path, docs: list[Document], empty: list[str], backend: Any, base_url: str,
         cache: ReplyCache, score_cache: ScoreCache, scorer: Any = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    got = _teach(cfg, docs, backend, base_url, cache, score_cache, scorer)
    n_mem = write_memories(out_dir / "memories.jsonl", got.memories)
    write_jsonl(out_dir / "candidates.jsonl", got.candidates)
    split, dropped = _write_sft(cfg, out_dir, docs, got)
    seconds = time.perf_counter() - t0
    manifest = _manifest(cfg, out_dir, docs, empty, got, n_mem, split, dropped, seconds, cache, score_cache)
    if cfg.teacher == "structure":
        _report_structure(manifest, got.unit_results, got.failures)
    write_json(out_dir / "manifest.json", manifest)
    _print_run(cfg, out_dir, docs, empty, manifest, got, seconds, cache)
    if n_mem == 0:
        failures = got.failures
        raise RunFailed(f"every one of the {len(docs)} documents failed; no memory and no SFT record was written "
                        f"(first failure: {failures[0]['stage']}: {failures[0]['error']})" if failures else
                        f"no memory was written for the {len(docs)} documents",
                        f"fix the cause, then rerun: paid replies are cached in {out_dir / 'teacher_cache.sqlite'}")
    return manifest


@dataclass
class _Taught:
    """What the teacher produced for every unit, gathered: results, failures, fates, candidates, memories."""

    unit_results: list[UnitResult]
    windows: dict[str, Any]
    failures: list[dict[str, Any]]
    teacher: CachedTeacher | None
    flow: TeacherFlow | None
    fates: list[str] = dataclass_field(default_factory=list)
    candidates: list[dict[str, Any]] = dataclass_field(default_factory=list)
    candidate_failures: list[dict[str, Any]] = dataclass_field(default_factory=list)
    memories: list[Any] = dataclass_field(default_factory=list)  # one per document (windows merged)
    unit_memories: list[Any] = dataclass_field(default_factory=list)  # one per unit (a window of a long document)

    @property
    def guided(self) -> int:
        return sum(1 for m in self.memories if m.meta.get("generation", {}).get("guided"))


def _teach(cfg: GenConfig, docs: list[Document], backend: Any, base_url: str, cache: ReplyCache,
           score_cache: ScoreCache, scorer: Any) -> _Taught:
    """Run the teacher (or the structure teacher) over every unit and gather what it produced."""
    if cfg.teacher == "structure":  # no model: the memory each document's sections imply
        unit_results, windows, failures = structure_results(cfg, docs)
        teacher, flow = None, None
    else:
        units, windows, failures = make_units(cfg, docs, backend)
        unit_results, teacher, flow = asyncio.run(_flow(cfg, units, backend, base_url, cache, score_cache, scorer)) \
            if units else ([], None, None)
    got = _Taught(unit_results, windows, failures, teacher, flow)
    for res in unit_results:
        got.failures += res.failures
        got.candidate_failures += res.candidate_failures
        got.fates += res.fates
        got.candidates += res.candidates
    got.memories, got.unit_memories, window_failures = merge_units(unit_results, windows, cfg.overlap_tokens)
    got.failures += window_failures
    return got


def _write_sft(cfg: GenConfig, out_dir: Path, docs: list[Document], got: _Taught) -> tuple[dict[str, Any], int]:
    """The SFT splits (one record per unit, balanced); returns the split record and how many were balanced away."""
    templates = got.flow.templates if got.flow else {}
    # A cut-off reply is never a training target, even when kept (flagged) as a memory.
    domains = {d.doc_id: str(d.meta[cfg.domain_field]) for d in docs} if cfg.domain_field else {}
    # one SFT record per unit: a long document's windows are what the student will read
    records = [sft_record(m, cfg.head_chars, cfg.tail_chars, templates, domains.get(m.doc_id.split("#w")[0]),
                          cfg.reader_prompt())
               for m in got.unit_memories if not m.meta.get("truncated")]
    records, dropped = balance(records, cfg.length_edges, cfg.max_per_stratum, cfg.split_seed)
    return write_sft_splits(out_dir, records, cfg.val_fraction, cfg.split_seed, cfg.length_edges), dropped


def _manifest(cfg: GenConfig, out_dir: Path, docs: list[Document], empty: list[str], got: _Taught, n_mem: int,
              split: dict[str, Any], dropped: int, seconds: float, cache: ReplyCache,
              score_cache: ScoreCache) -> dict[str, Any]:
    """The run's ``manifest.json``."""
    memories, teacher, flow = got.memories, got.teacher, got.flow
    flow_stats = teacher.dispatcher.stats.summary(cfg.max_concurrency if cfg.teacher == "openai" else None) \
        if teacher else {}
    return {
        "documents": len(docs),
        "skipped_empty": empty,
        "memories": n_mem,
        "failures": got.failures,
        "candidate_failures": got.candidate_failures,
        "whole_document_fallbacks": [m.doc_id for m in memories if "fallback" in m.meta],
        "guided": got.guided,
        "unguided": len(memories) - got.guided,
        "extraction_fates": count_fates(got.fates),
        "truncated_kept": [m.doc_id for m in memories if m.meta.get("truncated")],
        "single_chunk_no_boundary": [r.unit.unit_id for r in got.unit_results if r.memory is not None
                                     and r.unit.plan is not None and r.unit.plan.single_chunk
                                     and r.unit.window is None],
        "windowed": {doc_id: len(ws) for doc_id, ws in got.windows.items() if len(ws) > 1},
        "selection": {"num_candidates": cfg.num_candidates, "rrf_k": cfg.rrf_k, "candidates": len(got.candidates),
                      "scored_now": flow.scored_now if flow else 0, "scores_cached": score_cache.hits,
                      "evaluator": cfg.evaluator, "clarity_variant": cfg.clarity_variant},
        "sft": {**split, "balanced_away": dropped, "max_per_stratum": cfg.max_per_stratum,
                "domain_field": cfg.domain_field or None},
        "teacher": {"backend": cfg.teacher, "model": cfg.model, "calls": teacher.calls if teacher else 0,
                    "cache_hits": cache.hits, "reasked_unusable": cache.reasked, "flow": flow_stats},
        "templates": flow.templates if flow else {},
        "repairs": sum(1 for m in memories if m.meta.get("parse_diagnostics")),
        "without_reasoning": [m.doc_id for m in memories if cfg.reverse_com and not m.reasoning],
        "reasoning": reasoning_summary(cfg, got.unit_memories),
        "seconds": round(seconds, 2),
        "files": {"memories": str(out_dir / "memories.jsonl"), "candidates": str(out_dir / "candidates.jsonl"),
                  **split["files"]},
        "sha256": {"memories": sha256_file(out_dir / "memories.jsonl"),
                   "candidates": sha256_file(out_dir / "candidates.jsonl"), **split["sha256"]},
    }


def _print_run(cfg: GenConfig, out_dir: Path, docs: list[Document], empty: list[str], manifest: dict[str, Any],
               got: _Taught, seconds: float, cache: ReplyCache) -> None:
    """The run's lines on stdout: what was generated, then every note and warning."""
    n_mem, flow_stats = manifest["memories"], manifest["teacher"]["flow"]
    single_chunk, fallbacks = manifest["single_chunk_no_boundary"], manifest["whole_document_fallbacks"]
    windowed, guided = manifest["windowed"], got.guided
    skipped = count_fates(got.fates).get("truncated-skipped", 0)
    rate = f", {flow_stats['requests_per_s']} req/s" if flow_stats.get("requests") else ""
    share = f", {flow_stats['efficiency']:.0%} of the ideal throughput" if "efficiency" in flow_stats else ""
    how = "structure teacher, no model" if cfg.teacher == "structure" else \
        f"{guided} guided, {len(got.memories) - guided} unguided"
    print(
        f"gen: {len(docs)} docs → {n_mem} memories ({how}) from "
        f"{len(got.candidates)} candidates (N={cfg.num_candidates}), {len(got.failures)} failures ({skipped} cut off), "
        f"{manifest['teacher']['calls']} teacher calls ({cache.hits} cached{rate}{share}) in {seconds:.1f}s → {out_dir}"
    )
    if manifest["without_reasoning"]:
        fates = ", ".join(f"{k}: {v}" for k, v in manifest["reasoning"]["fates"].items()) or "none asked"
        print(f"NOTE: {len(manifest['without_reasoning'])}/{n_mem} memories have no reasoning path (reverse-CoM "
              f"replies {fates}; cut off or failed ones are left out): their SFT targets are the memory alone")
    if single_chunk:
        print(f"NOTE: {len(single_chunk)} document(s) had no chunk boundary in range and are one chunk each: "
              f"{single_chunk[:5]} (lower min_chunk_chars to cut them)")
    if fallbacks:
        print(f"WARNING: {len(fallbacks)}/{len(docs)} teacher replies had no usable chunk and were kept as "
              "WHOLE-DOCUMENT memories (on_unusable=whole); their SFT targets teach one chunk per document")
    if empty:
        print(f"NOTE: {len(empty)} document(s) with empty text were skipped (no teacher call): {empty[:5]}")
    if windowed:
        print(f"NOTE: {len(windowed)} long document(s) were read in {sum(windowed.values())} windows and merged "
              f"(one SFT record per window): {list(windowed)[:5]}")


def reasoning_summary(cfg: GenConfig, memories: list[Any]) -> dict[str, Any]:
    """What became of the reverse-CoM requests (one per unit): fates (ok, retried, truncated-skipped, error,
    empty, not-asked: the probe found the teacher does not end one) and the token budgets, so a report can say why
    reasoning paths are missing."""
    asked = [m.meta["reverse_com"] for m in memories if "reverse_com" in m.meta]
    fates = count_fates([a["fate"] for a in asked])
    return {"requests": len(asked) - fates.get("not-asked", 0), "fates": fates, "probe": cfg.com_probe,
            "max_new_tokens": cfg.com_max_new_tokens,
            "retry_max_new_tokens": 2 * cfg.com_max_new_tokens if cfg.on_truncated == "retry_longer" else None}


def _report_structure(manifest: dict[str, Any], results: list[UnitResult], failures: list[dict[str, Any]]) -> None:
    """The structure teacher's share of section starts that became chunk ends, and every refused document."""
    hit = sum(r.memory.meta["generation"]["section_starts_hit"] for r in results if r.memory is not None)
    total = sum(r.memory.meta["generation"]["sections"] - 1 for r in results if r.memory is not None)
    manifest["structure"] = {"section_starts": total, "chunk_ends_at_section_starts": hit}
    print(f"structure teacher: {hit} of {total} interior section starts are chunk ends (the others lie outside the "
          "chunk-length range and are crossed); no model call, no reasoning path, one candidate per document")
    for f in failures:
        print(f"REFUSED {f['doc_id']}: {f['stage']}: {f['error']}")


async def _flow(cfg: GenConfig, units: list[Unit], backend: Any, base_url: str, cache: ReplyCache,
                score_cache: ScoreCache, scorer: Any = None) -> tuple[list[UnitResult], CachedTeacher, TeacherFlow]:
    """Every unit as its own coroutine (at most ``active_units`` alive), one progress bar per step."""
    local = cfg.teacher in ("local", "vllm")
    lock = asyncio.Lock() if local else None  # teacher and evaluator share the CPU/GPU: one at a time
    dispatcher = Dispatcher(backend, max_concurrency=cfg.max_concurrency, batch_size=cfg.batch_size,
                            compute_lock=lock)
    teacher = CachedTeacher(dispatcher, cache, cfg.model, cfg.teacher, base_url, cfg.retry_unusable)
    scorer = (scorer or evaluator_scorer(cfg)) if cfg.num_candidates > 1 else None
    n = len(units)
    steps = (("outline", n), ("candidates", n * cfg.num_candidates), ("scoring", n), ("com", n))
    bars = {name: tqdm(total=total, desc=f"gen {name}", unit="req" if name != "scoring" else "doc", position=i,
                       leave=True) for i, (name, total) in enumerate(steps)}
    flow = TeacherFlow(cfg, teacher, scorer, score_cache, bars, lock)
    active = cfg.active_units or max(4 * cfg.max_concurrency, 2 * cfg.batch_size)
    try:
        results = await gather_bounded([lambda u=u: flow.run(u) for u in units], active)
    finally:
        for bar in bars.values():
            bar.close()
        await flow.score_batcher.aclose()
        await dispatcher.aclose()
    return results, teacher, flow


STAGE = Stage("gen", "teacher-side memory generation → memories + SFT data", run=generate, config=GenConfig,
              example_dir="configs/data_gen/", models=lambda c: {k: v for k, v, used in (
                  ("model", c.model, c.teacher != "openai"), ("evaluator", c.evaluator, c.num_candidates > 1)) if used})

if __name__ == "__main__":
    from memreader.cli import module_main

    raise SystemExit(module_main("gen"))
