"""Teacher-side data generation: outline → extraction → (reverse CoM) → memories + SFT records.

    memreader gen --config configs/data_gen/smollm2_local.yaml
    python -m data_gen.pipeline --config configs/data_gen/openai_teacher.yaml --set input=corpus.jsonl

One outline pass and one extraction pass per document (multi-path sampling and evaluator scoring
build on this later), guided by the document's memory grammar where the backend takes one
(``guided``; see :mod:`memreader.guidance`), parse + align into a validated :class:`DocumentMemory`,
then export SFT
records in TRL's conversational prompt-completion format (loss on the completion only). Every
teacher call goes through a SQLite cache keyed by template version, model, sampling parameters and
the messages, so a rerun or a resumed crash repeats no call.
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data_gen.cache import ReplyCache
from data_gen.cached_teacher import CachedTeacher
from data_gen.sft_export import sft_record, write_sft_splits
from memreader.assemble import memory_from_output
from memreader.config import add_config_arguments, field, load_config, stage_main
from memreader.corpus import CorpusError, Document, read_corpus, split_empty
from memreader.errors import RunFailed
from memreader.generation import GenerationParams, GenerationRequestError, make_chat
from memreader.guidance import (
    GuidedConfig,
    MemoryGrammars,
    count_fates,
    count_tokens_for,
    generate_with_policy,
    wants_grammar,
)
from memreader.markup import render_memory
from memreader.parser import ParseError
from memreader.paths import run_dir, write_json, write_resolved_config
from memreader.prompts import detect_lang, render
from memreader.runlock import RunLock
from memreader.schema import DocumentMemory, write_memories

log = logging.getLogger(__name__)


@dataclass
class GenConfig(GuidedConfig):
    """Settings of one data-generation run (the guided-decoding keys come from :class:`GuidedConfig`)."""

    input: str = field("", help="corpus JSONL, one {'id','text'} per line")
    id_field: str = field("id", help="name of the id field in the corpus")
    text_field: str = field("text", help="name of the text field in the corpus")
    limit: int = field(0, ge=0, help="only the first N documents (0 = all)")
    run: str = field("gen", help="run name: outputs go to $MEMREADER_HOME/runs/<run>/gen/")
    teacher: str = field("local", help="teacher backend: 'local' (in-process transformers) or 'openai'")
    model: str = field("smollm2-135m-instruct", help="teacher model name (registry name, folder or API model id)")
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
    on_unusable: str = field("skip", help="a teacher reply with no chunk at all: 'skip' the document (no SFT "
                             "record), or keep it as a 'whole'-document one-chunk memory (flagged, counted, "
                             "warned about; only sensible for smoke runs with a weak teacher)")
    head_chars: int = field(12, ge=1, help="characters before [MASK] in SFT targets")
    tail_chars: int = field(12, ge=1, help="characters after [MASK] in SFT targets")
    val_fraction: float = field(0.1, ge=0, lt=1, help="share of documents held out for validation (at least one when >0)")
    split_seed: int = field(13, ge=0, help="seed of the train/validation split")
    retry_unusable: bool = field(False, help="ask the teacher again for cached replies that were cut off or unusable")
    def marker(self) -> dict[str, int]:
        """Chunk markers as in the SFT targets, at most max_parts chunks."""
        return {"head_chars": self.head_chars, "tail_chars": self.tail_chars, "max_scenarios": self.max_parts}

    def check(self) -> list[str]:
        """Problems a config file can have beyond types."""
        problems = self.guided_problems(**self.marker())
        if not self.input:
            problems.append("input: give a corpus JSONL path (input=...)")
        if self.on_unusable not in ("skip", "whole"):
            problems.append(f"on_unusable: {self.on_unusable!r} is not 'skip' or 'whole'")
        if self.teacher not in ("local", "openai"):
            problems.append(f"teacher: {self.teacher!r} is not 'local' or 'openai'")
        if self.max_parts < self.min_parts:
            problems.append(f"min_parts/max_parts: need min_parts <= max_parts, got {self.min_parts}/{self.max_parts}")
        return problems


def _outline_lines(reply: str) -> list[str]:
    """Outline topics from an outline reply; tolerant of a missing tag."""
    text = reply
    if "<outline>" in reply:
        text = reply.split("<outline>", 1)[1].split("</outline>", 1)[0]
    lines = [ln.strip(" -*•\t") for ln in text.splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("<")]


def generate(cfg: GenConfig) -> dict[str, Any]:
    """Run the pipeline; returns the manifest (also written to the run folder). One writer per run
    folder; a run in which every document failed raises :class:`RunFailed` (exit code 1)."""
    out_dir = run_dir(cfg.run, "gen")
    with RunLock(out_dir):
        return _generate(cfg, out_dir)


def _generate(cfg: GenConfig, out_dir: Path) -> dict[str, Any]:
    docs, empty = split_empty(read_corpus(cfg.input, cfg.id_field, cfg.text_field, cfg.limit or None))
    if not docs:
        raise CorpusError(f"every document of {cfg.input} has empty text ({len(empty)}: {empty[:5]})",
                          "give documents with text")
    if empty:  # before any paid call
        log.warning("skipping %d document(s) with empty text: %s", len(empty), empty[:5])
    if cfg.teacher == "openai":
        backend = make_chat("openai", model=cfg.model, base_url=cfg.base_url or None, max_concurrency=cfg.max_concurrency,
                            guided=cfg.guided)
        base_url = backend.base_url or ""
    else:
        backend = make_chat("local", model_name=cfg.model, batch_size=cfg.batch_size)
        base_url = ""
    write_resolved_config(out_dir, cfg)  # after the checks: a refused run leaves the earlier record as it was
    cache = ReplyCache(out_dir / "teacher_cache.sqlite")
    teacher = CachedTeacher(backend, cache, cfg.model, cfg.teacher, base_url, cfg.retry_unusable)
    t0 = time.perf_counter()

    outline_params = GenerationParams(cfg.temperature, cfg.top_p, cfg.outline_max_new_tokens, seed=cfg.seed)
    extract_params = GenerationParams(cfg.temperature, cfg.top_p, cfg.max_new_tokens, seed=cfg.seed)
    langs = [detect_lang(d.text) for d in docs]
    templates: dict[str, str] = {}

    failures: list[dict[str, str]] = []

    def failed(doc_id: str, stage: str, error: Exception | str) -> None:
        failures.append({"doc_id": doc_id, "stage": stage, "error": str(error)})
        log.warning("doc %s: %s failed, no memory for it (%s)", doc_id, stage, error)

    plans: list = [None] * len(docs)
    refused: dict[int, str] = {}
    if wants_grammar(cfg.guided, cfg.teacher):
        grammars = MemoryGrammars(cfg.grammar_settings(**cfg.marker()), count_tokens_for(backend),
                                  may_go_unguided=cfg.teacher == "openai" and cfg.guided == "auto")
        plans, refused = grammars.plan([d.text for d in docs], cfg.max_new_tokens)
        for i, error in refused.items():  # checked before any paid call
            failed(docs[i].doc_id, "guidance", error)
    outline_msgs, planned = [], []
    for i, (doc, lang, plan) in enumerate(zip(docs, langs, plans, strict=True)):
        if i in refused:
            continue
        msgs, tpl = render("teacher_outline", lang, document=doc.text, min_parts=cfg.min_parts, max_parts=cfg.max_parts)
        templates[tpl.id] = tpl.version
        outline_msgs.append((tpl.id, msgs))
        planned.append((doc, lang, plan))
    live: list[tuple[Document, str, list[str], object]] = []
    for (doc, lang, plan), reply in zip(planned, teacher.generate(outline_msgs, outline_params, "outline"), strict=True):
        if isinstance(reply, GenerationRequestError):
            failed(doc.doc_id, "outline request", reply)
        else:
            live.append((doc, lang, _outline_lines(reply), plan))

    extract_msgs = []
    for doc, lang, outline, _ in live:
        msgs, tpl = render("teacher_extraction", lang, document=doc.text, outline="\n".join(outline) or "-")
        templates[tpl.id] = tpl.version
        extract_msgs.append((tpl.id, msgs))
    larks = [plan.lark if plan is not None else None for *_, plan in live]

    def call(idx: list[int], params: GenerationParams) -> list:
        return teacher.generate([extract_msgs[k] for k in idx], params, "extraction", [larks[k] for k in idx])

    replies, fates = generate_with_policy(call, len(live), extract_params, cfg.on_truncated) if live else ([], [])

    memories: list[DocumentMemory] = []
    single_chunk: list[str] = []
    on_unparseable = "whole" if cfg.on_unusable == "whole" else "raise"
    for k, ((doc, _, _, plan), reply, fate) in enumerate(zip(live, replies, fates, strict=True)):
        if isinstance(reply, GenerationRequestError):
            failed(doc.doc_id, "extraction request", reply)
            continue
        if fate == "truncated-skipped":
            failed(doc.doc_id, "extraction reply", f"cut off at the token budget (on_truncated={cfg.on_truncated}); "
                   "raise max_new_tokens, then rerun with retry_unusable=true")
            continue
        meta = {"model": cfg.model, "prompt": extract_msgs[k][0], "candidate": 0, "source_sha256": doc.sha256,
                "generation": {**reply.info(), "fate": fate, "grammar": plan.meta() if plan else None}}
        if fate == "truncated-kept":
            meta["truncated"] = True
        try:
            mem = memory_from_output(doc.doc_id, doc.text, reply, meta, on_unparseable,
                                     graph=plan.graph if plan is not None and reply.guided else None)
        except ParseError as exc:
            teacher.mark_unusable(extract_msgs[k], extract_params, larks[k])
            failed(doc.doc_id, "extraction reply", exc)
            continue
        if "fallback" in mem.meta:
            teacher.mark_unusable(extract_msgs[k], extract_params, larks[k])
        if plan is not None and plan.single_chunk:
            single_chunk.append(doc.doc_id)
        memories.append(mem)

    if cfg.reverse_com and memories:
        _add_reasoning(teacher, memories, cfg, templates)

    fallbacks = [m.doc_id for m in memories if "fallback" in m.meta]
    truncated_kept = [m.doc_id for m in memories if m.meta.get("truncated")]
    n_mem = write_memories(out_dir / "memories.jsonl", memories)
    # A cut-off reply is never a training target, even when kept (flagged) as a memory.
    records = [sft_record(m, cfg.head_chars, cfg.tail_chars, templates) for m in memories if not m.meta.get("truncated")]
    guided = sum(1 for m in memories if m.meta.get("generation", {}).get("guided"))
    split = write_sft_splits(out_dir, records, cfg.val_fraction, cfg.split_seed)
    seconds = time.perf_counter() - t0
    manifest = {
        "documents": len(docs),
        "skipped_empty": empty,
        "memories": n_mem,
        "failures": failures,
        "whole_document_fallbacks": fallbacks,
        "guided": guided,
        "unguided": len(memories) - guided,
        "extraction_fates": count_fates(fates),
        "truncated_kept": truncated_kept,
        "single_chunk_no_boundary": single_chunk,
        "sft": split,
        "teacher": {"backend": cfg.teacher, "model": cfg.model, "calls": teacher.calls, "cache_hits": cache.hits,
                    "reasked_unusable": cache.reasked},
        "templates": templates,
        "repairs": sum(1 for m in memories if m.meta.get("parse_diagnostics")),
        "without_reasoning": [m.doc_id for m in memories if cfg.reverse_com and not m.reasoning],
        "seconds": round(seconds, 2),
        "files": {"memories": str(out_dir / "memories.jsonl"), **split["files"]},
    }
    write_json(out_dir / "manifest.json", manifest)
    cache.close()
    skipped = count_fates(fates).get("truncated-skipped", 0)
    print(
        f"gen: {len(docs)} docs → {n_mem} memories ({guided} guided, {len(memories) - guided} unguided), "
        f"{len(failures)} failed ({skipped} cut off), {teacher.calls} teacher calls ({cache.hits} cached) "
        f"in {seconds:.1f}s → {out_dir}"
    )
    if manifest["without_reasoning"]:
        print(f"NOTE: {len(manifest['without_reasoning'])}/{n_mem} memories have no reasoning path (the reverse-CoM "
              "reply was cut off or failed): their SFT targets are the memory alone")
    if single_chunk:
        print(f"NOTE: {len(single_chunk)} document(s) had no chunk boundary in range and are one chunk each: "
              f"{single_chunk[:5]} (lower min_chunk_chars to cut them)")
    if fallbacks:
        print(f"WARNING: {len(fallbacks)}/{len(docs)} teacher replies had no usable chunk and were kept as "
              "WHOLE-DOCUMENT memories (on_unusable=whole); their SFT targets teach one chunk per document")
    if empty:
        print(f"NOTE: {len(empty)} document(s) with empty text were skipped (no teacher call): {empty[:5]}")
    if n_mem == 0:
        raise RunFailed(f"every one of the {len(docs)} documents failed; no memory and no SFT record was written "
                        f"(first failure: {failures[0]['stage']}: {failures[0]['error']})" if failures else
                        f"no memory was written for the {len(docs)} documents",
                        f"fix the cause, then rerun: paid replies are cached in {out_dir / 'teacher_cache.sqlite'}")
    return manifest


def _add_reasoning(teacher: CachedTeacher, memories: list[DocumentMemory], cfg: GenConfig, templates: dict[str, str]) -> None:
    params = GenerationParams(cfg.temperature, cfg.top_p, cfg.com_max_new_tokens, seed=cfg.seed)
    items = []
    for mem in memories:
        target = render_memory(mem.outline, mem.chunks, mem.cores, None, cfg.head_chars, cfg.tail_chars)
        msgs, tpl = render("reverse_com", detect_lang(mem.document), document=mem.document, memory=target)
        templates[tpl.id] = tpl.version
        items.append((tpl.id, msgs))
    def call(idx: list[int], p: GenerationParams) -> list:
        return teacher.generate([items[k] for k in idx], p, "reverse CoM")

    # The reasoning is part of the SFT target: a cut-off one is never kept (keep_flagged counts as skip
    # here); retry_longer asks once more with twice com_max_new_tokens first.
    policy = "retry_longer" if cfg.on_truncated == "retry_longer" else "skip"
    replies, fates = generate_with_policy(call, len(items), params, policy)
    for mem, reply, fate in zip(memories, replies, fates, strict=True):
        if isinstance(reply, GenerationRequestError):
            mem.meta["reverse_com_error"] = str(reply)  # kept without reasoning; counted in the manifest
            log.warning("doc %s: reverse CoM request failed, memory kept without reasoning (%s)", mem.doc_id, reply)
            continue
        if fate == "truncated-skipped":
            mem.meta["reverse_com_error"] = "reasoning cut off at its token budget; left out of the SFT target"
            log.warning("doc %s: reverse CoM reply cut off (on_truncated=%s); memory kept without reasoning",
                        mem.doc_id, cfg.on_truncated)
            continue
        text = reply.split("</think>")[-1].strip()  # R1-style teachers may wrap their own thinking
        mem.reasoning = text or None


CONFIG_CLASS = GenConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of this stage's subcommand."""
    add_config_arguments(parser, "configs/data_gen/")


def run(args: argparse.Namespace) -> int:
    """Entry point behind the CLI."""
    generate(load_config(GenConfig, args.config, args.set))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m`` entry point."""
    return stage_main(__doc__, GenConfig, run, argv, "configs/data_gen/")


if __name__ == "__main__":
    raise SystemExit(main())

