"""MemReader batch reading (``memreader read``): a corpus in, validated document memories out (resumable).

    memreader read --config configs/inference/smollm2_cpu.yaml --set adapter=artifacts/runs/demo/train/adapter

:func:`read_documents` is the per-document code that ``read-dist`` shares: engine from
:func:`memreader.core.engines.resolve_engine` (stage ``read``), documents streamed through it
(:mod:`memreader.inference.reading`), guided decoding (:mod:`memreader.core.guidance`) and windows for long
documents (:mod:`memreader.core.windowing`). Details: docs/USAGE.md (Your own files), docs/ENGINES.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from memreader.core.config import field
from memreader.core.corpus import CorpusConfig, Document, iter_corpus
from memreader.core.cut_features import CUT_DTYPES, CutScorerError, cut_dtype
from memreader.core.cut_head import (
    CutScorer,
    Cutter,
    check_threshold,
    head_sha256,
    min_gap,
    resolve_head_folder,
)
from memreader.core.engines import (
    EngineKeys,
    backend_field,
    device_field,
    dtype_field,
    make_engine,
)
from memreader.core.errors import RunFailed
from memreader.core.generation import GenerationParams
from memreader.core.generation.stream import open_stream
from memreader.core.guidance import GuidedConfig, MemoryGrammars, count_fates, count_tokens_for, wants_grammar
from memreader.core.language import detect_language
from memreader.core.paths import run_dir, sha256_file, write_json, write_resolved_config
from memreader.core.prompts import PromptConfig
from memreader.core.registry import SMOLLM2
from memreader.core.runlock import RunLock
from memreader.core.schema import MemoryValidationError, iter_memories, write_memories
from memreader.core.stage import Stage
from memreader.core.vllm_engine import COMPILE_MODES, LORA_MODES
from memreader.core.windowing import WindowConfig, model_window_of, prompt_tokens_of
from memreader.inference.reading import Reading, Tally, cut_ahead

log = logging.getLogger(__name__)

ENGINE = EngineKeys("read")


@dataclass
class ReadConfig(CorpusConfig, GuidedConfig, WindowConfig, PromptConfig):
    """Settings of one MemReader reading run (the guided-decoding keys come from :class:`GuidedConfig`)."""

    run: str = field("read", help="outputs go to $MEMREADER_HOME/runs/<run>/read/")
    backend: str = backend_field("read", "the reading model")
    dtype: str = dtype_field("transformers/vllm weights")
    device: str = device_field("backend=transformers")
    lora_mode: str = field("auto", help="backend=vllm with an adapter: merge (fold it in once; auto on CPU) or request "
                           "(LoRARequest per request; auto on GPU)")
    kv_cache_gib: float = field(2.0, gt=0, help="backend=vllm on a CPU: GiB of KV cache (2 GiB: 32 requests of about 1,750 tokens with SmolLM2; fewer run at once, with a NOTE, when they do not fit)")
    compile_mode: str = field("auto", help="backend=vllm: eager (no torch.compile / CUDA graphs) or compiled; auto = "
                              "eager on CPU (the 72 s compile pays off only past ~60k generated tokens), compiled on GPU")
    max_lora_rank: int = field(64, ge=1, help="backend=vllm, lora_mode=request: the largest adapter rank the engine takes")
    model: str = field(SMOLLM2, help="base model (registry name, folder, hub id, or served name)")
    adapter: str = field("", help="LoRA adapter folder (empty: base model only)")
    cut_head: str = field("auto", help="cut scorer head whose breaks go into each memory grammar: auto = the "
                          "adapter's cut_head/ when it has one, none = off, or a head folder (docs/TRAINING.md)")
    cut_threshold: float = field(0.0, ge=0, lt=1, help="P(topic change) an allowed end needs to become a break; 0 = "
                                 "the threshold chosen on the head's tuning split (stored with it)")
    cut_dtype: str = field("auto", help="the cut head's prefill on the CPU: auto (bf16 autocast where the CPU's bf16 "
                           "matmul is faster by the cached probe — 2.2x, the same breaks, measured — else fp32), "
                           "float32 (as the head was fitted) or bfloat16")
    cut_ahead: int = field(-1, ge=-1, help="documents the cut head scores ahead, in a worker thread while the engine "
                           "generates; 0: each in turn, before its document goes in; -1 (auto): 0 when the engine "
                           "computes on this machine's CPU (the two compete for the cores: measured slower, "
                           "docs/BENCHMARKS.md), 2 when it runs on a GPU or a server")
    base_url: str = field("", help="for backend=openai: server URL (else MEMREADER_READER_BASE_URL; the teacher's "
                          "URL is never used, so a corpus never goes to the teacher's provider)")
    request_timeout_s: float = field(60.0, gt=0, help="backend=openai: seconds one request may take before it is "
                                     "retried (a CPU server generating a long memory can need minutes)")
    think: bool = field(False, help="use the <think> (CoM) prompt variant")
    batch_size: int = field(4, ge=1, help="requests decoded together: vLLM keeps this many in the running engine, "
                            "topped up as each finishes; transformers and servers get this many per call")
    max_new_tokens: int = field(512, ge=1, help="token budget per memory")
    temperature: float = field(0.1, ge=0, help="paper: 0.1")
    top_p: float = field(0.1, gt=0, le=1, help="paper: 0.1")
    repetition_penalty: float = field(1.05, gt=0, help="paper: 1.05")
    seed: int = field(0, ge=0, help="sampling seed")
    max_model_len: int = field(8192, ge=1, help="for backend=vllm: context length")
    fuzzy_threshold: float = field(85.0, ge=0, le=100, help="aligner: rapidfuzz score a fuzzy head/tail must reach")
    head_chars: int = field(12, ge=1, help="characters before [MASK] in a guided chunk marker (as in SFT targets)")
    tail_chars: int = field(12, ge=1, help="characters after [MASK] in a guided chunk marker")
    max_scenarios: int = field(6, ge=1, help="guided: most chunks per memory (longer documents get longer chunks)")
    think_tokens: int = field(160, ge=0, help="guided, think=true: most tokens of the <think> block")

    def marker(self) -> dict[str, int]:
        """Chunk-marker shape, chunk count and think budget of this run's memory grammars."""
        return {"head_chars": self.head_chars, "tail_chars": self.tail_chars, "max_scenarios": self.max_scenarios,
                "think_tokens": self.think_tokens if self.think else 0}

    def problems(self) -> list[str]:
        """Problems beyond types."""
        problems = self.guided_problems(**self.marker())
        problems += self.windows().problems() + self.prompt_problems()
        if self.backend == "openai" and not (self.base_url or os.environ.get("MEMREADER_READER_BASE_URL")):
            problems.append("base_url: backend=openai needs the reading server's URL (base_url=... or "
                            "MEMREADER_READER_BASE_URL); the reader never falls back to the teacher's endpoint")
        problems += self.corpus_problems() + ENGINE.problems(self)
        for key, allowed in (("lora_mode", LORA_MODES), ("compile_mode", COMPILE_MODES), ("cut_dtype", CUT_DTYPES)):
            if getattr(self, key) not in allowed:
                problems.append(f"{key}: {getattr(self, key)!r} is not one of {', '.join(allowed)}")
        return problems


def read_key(cfg: ReadConfig) -> str:
    """Hash of everything besides the document that shapes a memory: model, adapter weights,
    prompt variant, decoding, alignment and window settings. Stored in every memory's meta."""
    adapter_sha = None
    if cfg.adapter:
        weights = Path(cfg.adapter) / "adapter_model.safetensors"
        if not weights.is_file():
            raise FileNotFoundError(f"adapter {cfg.adapter} has no adapter_model.safetensors; pass a `memreader train` "
                                    "output folder, or adapter='' for the base model")
        adapter_sha = sha256_file(weights)
    keyed = {k: getattr(cfg, k) for k in ("backend", "dtype", "model", "think", "max_new_tokens", "temperature", "top_p",
                                          "repetition_penalty", "seed", "fuzzy_threshold", "guided", "head_chars",
                                          "tail_chars", "min_chunk_chars", "max_chunk_chars", "cjk_char_weight",
                                          "max_scenarios", "core_tokens", "topic_tokens", "think_tokens",
                                          "window_tokens", "overlap_tokens")}
    folder, _ = resolve_head_folder(cfg.cut_head, cfg.adapter)
    if folder is not None:  # memories read with a head differ from those read without: another key
        keyed["cut_head"] = {"sha256": head_sha256(folder), "threshold": cfg.cut_threshold,
                             "dtype": cut_dtype(cfg.cut_dtype)}
    blob = json.dumps({**keyed, "adapter_sha256": adapter_sha, **cfg.reader_prompt(cfg.think).key()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _done(path: Path) -> dict[str, tuple[str | None, str | None]]:
    """doc_id → (source_sha256, read_key) already written; a half-written last line (crash
    mid-write) is cut off loudly."""
    if not path.is_file():
        return {}
    _drop_torn_tail(path)
    try:
        return {m.doc_id: (m.meta.get("source_sha256"), m.meta.get("read_key")) for m in iter_memories(path)}
    except MemoryValidationError as exc:
        raise MemoryValidationError(f"cannot resume: {exc}. Move the file away to start over.") from None


def _drop_torn_tail(path: Path) -> None:
    """Cut a half-written last line (no newline, not JSON) off ``path``, reading only the file's tail."""
    size = path.stat().st_size
    if not size:
        return
    with path.open("rb+") as fh:
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as view:
            if view[-1:] == b"\n":
                return
            start = view.rfind(b"\n") + 1  # searched from the end: only the tail is read
            tail = view[start:]
        try:
            json.loads(tail.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            log.warning("%s: dropping a half-written last line from an interrupted run", path)
            fh.truncate(start)


def resolved(cfg: ReadConfig) -> ReadConfig:
    """``cfg`` with ``backend`` and ``dtype`` decided (``auto`` → ``ENGINE.choice``, stage ``read``), so the read key
    and every memory record what produced it (an HTTP server's dtype setting is kept as given: it names nothing).
    ``device`` is decided where the engine is built (a read-dist worker's GPU is not the driver's)."""
    choice = ENGINE.choice(cfg)
    out = replace(cfg, backend=choice.backend, dtype=cfg.dtype if choice.backend == "openai" else choice.dtype)
    if (out.backend, out.dtype) != (cfg.backend, cfg.dtype):
        log.info("read: backend %s, dtype %s, device %s (%s)", out.backend, out.dtype, choice.device, choice.why)
    return out


def make_backend(cfg: ReadConfig, **settings: Any) -> Any:
    """The generation engine ``ENGINE.choice`` names (``settings``: more engine settings, e.g. a worker's
    ``tensor_parallel_size``)."""
    cfg = resolved(cfg)
    return make_engine(ENGINE.choice(cfg), cfg.model, adapter=cfg.adapter, batch_size=cfg.batch_size,
                       max_model_len=cfg.max_model_len, lora_mode=cfg.lora_mode, kv_cache_gib=cfg.kv_cache_gib,
                       max_lora_rank=cfg.max_lora_rank, compile_mode=cfg.compile_mode, base_url=cfg.base_url,
                       max_concurrency=cfg.batch_size, guided=cfg.guided, env_prefix="MEMREADER_READER",
                       timeout_s=cfg.request_timeout_s, **settings)


def read_corpus_memories(cfg: ReadConfig, backend: Any | None = None) -> dict[str, Any]:
    """Read every not-yet-read document; returns the run summary. One writer per run folder: a
    second process on the same run is refused, naming the first."""
    out_dir = run_dir(cfg.run, "read")
    with RunLock(out_dir):
        return _read(resolved(cfg), out_dir, backend)


def read_documents(cfg: ReadConfig, docs: list[Document], out_dir: Path, backend: Any | None = None) -> dict[str, Any]:
    """Read ``docs`` (e.g. one shard of a corpus, see :mod:`memreader.inference.distributed`) into
    ``out_dir/memories.jsonl`` exactly as a whole run reads them, resuming what that file already holds;
    the summary is returned and written beside it. No run lock: the caller owns ``out_dir``. Unlike a
    whole run, a call in which every document failed does not raise: its summary names them."""
    return _read(resolved(cfg), out_dir, backend, docs, strict=False)


def _read(cfg: ReadConfig, out_dir: Path, backend: Any | None, given: list[Document] | None = None,
          strict: bool = True) -> dict[str, Any]:
    out_path = out_dir / "memories.jsonl"

    def corpus() -> Iterator[Document]:  # read twice, streaming: the corpus is never held whole
        return iter(given) if given is not None else iter_corpus(cfg.input, cfg.id_field, cfg.text_field,
                                                                 cfg.limit or None)

    if backend is not None and callable(getattr(backend, "describe", None)):
        engine = backend.describe()  # a given backend is what the memories record
        cfg = replace(cfg, backend=engine.get("backend", cfg.backend), dtype=engine["dtype"])
    key = read_key(cfg)
    done = _done(out_path)
    survey = _survey(corpus(), done, key)
    _check_resumable(cfg, survey, out_path)
    write_resolved_config(out_dir, cfg)  # only now: a refused run leaves the earlier record as it was
    if done:
        print(f"read: resumed: {survey.n_done} of {survey.n_docs - len(survey.empty)} documents already done in "
              f"{out_path}")
    if survey.empty:
        log.warning("skipping %d document(s) with empty text: %s", len(survey.empty), survey.empty[:5])
    params = GenerationParams(cfg.temperature, cfg.top_p, cfg.max_new_tokens, cfg.repetition_penalty, cfg.seed)
    prompt = cfg.reader_prompt(cfg.think)
    tally = Tally()
    t0 = time.perf_counter()
    if survey.n_todo:
        backend, grammars, sizing = _open_backend(cfg, backend, prompt, survey.langs)
        capacity = backend.kv_capacity_tokens() if callable(getattr(backend, "kv_capacity_tokens", None)) else 0
        reading = Reading(cfg, key, prompt, grammars, sizing, params, open_stream(backend, cfg.batch_size), tally,
                          capacity, lambda messages: prompt_tokens_of(messages, backend, sizing["count_tokens"]),
                          cutter=open_cutter(cfg, grammars))
        engine = backend.describe() if callable(getattr(backend, "describe", None)) else {}
        _read_stream((d for d in corpus() if d.text.strip() and d.doc_id not in done), out_path, reading,
                     survey.n_todo, cut_ahead_depth(cfg.cut_ahead, engine))
        tally.memory_limit = reading.memory_limit
        tally.cut_head = reading.cutter.describe() if reading.cutter is not None else None
        _corpus_order(out_path, (d.doc_id for d in corpus()))
    seconds = time.perf_counter() - t0
    summary = _summary(cfg, survey, tally, seconds, out_path, backend)
    write_json(out_dir / "summary.json", summary)
    _report(cfg, summary, tally, survey, out_path, seconds)
    if strict and survey.n_todo and summary["read"] == 0:
        raise RunFailed(f"every one of the {survey.n_todo} documents to read failed or was cut off; nothing was "
                        f"written", f"see the warnings above and {out_dir / 'summary.json'}")
    return summary


def _read_stream(todo: Iterator[Document], out_path: Path, reading: Reading, total: int, ahead: int) -> None:
    """Pass 2: every document still to read goes through ``reading``'s stream, kept full; each memory is appended the
    moment its document is done (a crash loses only the documents in flight). A failure or an interrupt takes the
    requests still in the engine back out of it. ``ahead``: documents the cut head scores ahead (:func:`cut_ahead`)."""
    bar = tqdm(total=total, desc="read", unit="doc")

    def write(finished: list[tuple[Document, Any]]) -> None:
        write_memories(out_path, [m for _, m in finished if m is not None], append=True)
        bar.update(len(finished))

    try:
        for doc, cuts in cut_ahead(todo, reading.cutter, ahead):
            flight = reading.plan(doc, cuts)
            if flight is None:  # refused before any request
                bar.update(1)
                continue
            while not reading.fits(flight):
                write(reading.step())
            reading.add(flight)
        while reading.pending:
            write(reading.step())
    finally:
        reading.stream.close()
        bar.close()


def _corpus_order(path: Path, ids: Iterator[str]) -> None:
    """Rewrite ``path`` (atomically) with its memories in corpus order: they were appended as they finished, and a
    finished run's file reads like the corpus, whatever the batch (memories of documents no longer in the corpus
    stay, last)."""
    if not path.is_file():
        return
    rank = {doc_id: i for i, doc_id in enumerate(ids)}
    with path.open(encoding="utf-8") as fh:
        lines = [line for line in fh if line.strip()]
    keyed = [(rank.get(json.loads(line)["doc_id"], len(rank)), i, line) for i, line in enumerate(lines)]
    if [k[:2] for k in keyed] == sorted(k[:2] for k in keyed):
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.writelines(line for _, _, line in sorted(keyed))
    os.replace(tmp, path)


@dataclass
class _Survey:
    """Pass 1 over the corpus: counts, empty documents, stale ones and the languages to size windows for (no text
    is kept)."""

    n_docs: int = 0
    n_todo: int = 0
    empty: list[str] = dc_field(default_factory=list)
    stale: list[str] = dc_field(default_factory=list)
    langs: set[str] = dc_field(default_factory=set)

    @property
    def n_done(self) -> int:
        return self.n_docs - len(self.empty) - self.n_todo


def _survey(docs: Iterator[Document], done: dict[str, tuple[str | None, str | None]], key: str) -> _Survey:
    survey = _Survey()
    for d in docs:
        survey.n_docs += 1
        if not d.text.strip():
            survey.empty.append(d.doc_id)
        elif d.doc_id in done:
            if done[d.doc_id] != (d.sha256, key):
                survey.stale.append(d.doc_id)
        else:
            survey.n_todo += 1
            survey.langs.add(detect_language(d.text))
    return survey


def _check_resumable(cfg: ReadConfig, survey: _Survey, out_path: Path) -> None:
    """Refuse a corpus with no text at all, and a resume that would mix memories of other texts or settings."""
    if len(survey.empty) == survey.n_docs:
        raise cfg.no_text(survey.empty)
    if survey.stale:
        raise MemoryValidationError(
            f"{out_path} already holds {len(survey.stale)} of these documents read from other text or with other "
            f"settings (model, adapter weights, prompt, decoding, windows), e.g. {survey.stale[:3]}; resuming would "
            "mix them. Use a new run name, or delete the file to read everything again."
        )


def cut_ahead_depth(setting: int, engine: dict[str, Any]) -> int:
    """How many documents the cut head scores ahead (``cut_ahead``; ``engine``: the backend's ``describe()``); auto:
    none where the engine computes on this machine's CPU, else 2, so that the CPU does not wait."""
    if setting >= 0:
        return setting
    return 0 if engine.get("backend") in ("transformers", "vllm") and engine.get("device", "cpu") == "cpu" else 2


def open_cutter(cfg: ReadConfig, grammars: Any) -> Cutter | None:
    """The cut scorer the run reads with (``cut_head``), or None; says once which, and why when there is none. A head
    needs the memory grammar (its breaks are grammar breaks): an unguided run is refused with one."""
    folder, note = resolve_head_folder(cfg.cut_head, cfg.adapter)
    print(f"read: {note}")
    if folder is None:
        return None
    if grammars is None:
        if cfg.cut_head == "auto":
            print("read: cut head: not used: this run is not guided (its breaks are memory-grammar breaks)")
            return None
        raise CutScorerError(f"cut_head={cfg.cut_head} needs guided reading (guided=off or an unguided backend here): "
                             "its breaks are memory-grammar breaks", "set guided=auto, or cut_head=none")
    scorer = CutScorer.load(folder, cfg.model, dtype=cfg.cut_dtype)
    threshold = check_threshold(cfg.cut_threshold) if cfg.cut_threshold else scorer.threshold
    return Cutter(scorer, threshold, lambda text: min_gap(text, grammars.settings))


def _open_backend(cfg: ReadConfig, backend: Any | None, prompt: Any, langs: set[str]) -> tuple[Any, Any, dict]:
    """The engine (built now unless given, checked reachable), the memory grammars and the window sizing."""
    backend = backend or make_backend(cfg)
    if callable(getattr(backend, "check_reachable", None)):
        backend.check_reachable()  # an unreachable server is a configuration error, before any document
    count = count_tokens_for(backend)
    grammars = MemoryGrammars(cfg.grammar_settings(**cfg.marker()), count, may_go_unguided=cfg.backend == "openai"
                              and cfg.guided == "auto") if wants_grammar(cfg.guided, cfg.backend) else None
    sizing = {"count_tokens": count, "settings": cfg.windows(), "max_new_tokens": cfg.max_new_tokens,
              "prompt_tokens": max(prompt_tokens_of(prompt.render(lang, "")[0], backend, count)
                                   for lang in sorted(langs)),
              "model_window": model_window_of(backend),  # a vLLM engine's is its max_model_len
              "grammar": grammars.settings if grammars else None}
    return backend, grammars, sizing


def _summary(cfg: ReadConfig, survey: _Survey, tally: Tally, seconds: float, out_path: Path,
             backend: Any) -> dict[str, Any]:
    """The run's ``summary.json``."""
    truncated = count_fates(tally.fates)
    n = survey.n_todo - len(tally.failed) - truncated.get("truncated-skipped", 0)
    stats = tally.stats
    return {
        "documents": survey.n_docs - len(survey.empty),
        "read": n,
        "skipped_done": survey.n_done,
        "skipped_empty": survey.empty,
        "failed": tally.failed,
        "guided": stats["guided"],
        "unguided": stats["unguided"],
        "fates": truncated,
        "truncated_skipped": truncated.get("truncated-skipped", 0),
        "single_chunk_no_boundary": tally.single_chunk,
        "windowed": stats["windowed"],
        "windows": stats["windows"],
        "fallback_whole_document": stats["fallbacks"],
        "asked_again": stats["asked_again"],  # replies cut off and asked again with twice the budget
        "memory_limit": tally.memory_limit,  # set when the KV cache, not batch_size, capped the requests in flight
        "cut_head": tally.cut_head,  # the head whose breaks went into the grammars, its threshold and seconds
        "repaired_outputs": stats["repaired"],
        "merged_scenarios": stats["merged_scenarios"],
        "mean_coverage_exact": round(stats["coverage_exact_sum"] / n, 4) if n else None,
        "seconds": round(seconds, 2),
        "docs_per_s": round(n / seconds, 3) if n and seconds else None,
        "memories": str(out_path),
        "engine": (backend.describe() if callable(getattr(backend, "describe", None)) else
                   {"backend": cfg.backend, "dtype": cfg.dtype}),
    }


def warn_unwritten(failed: dict[str, str], truncated: int, max_new_tokens: int, rerun: str = "") -> None:
    """The warnings on stdout for documents that failed (the first three named; ``rerun``: what to add) and replies
    cut off by ``max_new_tokens``: neither was written."""
    if failed:
        named = "; ".join(f"{d}: {e}" for d, e in list(failed.items())[:3])
        print(f"WARNING: {len(failed)} document(s) failed and were not written ({named}){rerun}")
    if truncated:
        print(f"WARNING: {truncated} reply(ies) were cut off by max_new_tokens={max_new_tokens} "
              "and not written; raise max_new_tokens and rerun (finished documents are kept)")


def memory_limit_note(cfg: ReadConfig, limit: dict[str, int]) -> str:
    """The run's line when memory, not ``batch_size``, capped the requests in flight: the setting, the measured
    limit and the fix."""
    where = (f"the vLLM engine's KV cache holds {limit['capacity_tokens']:,} tokens (kv_cache_gib={cfg.kv_cache_gib:g})"
             if cfg.backend == "vllm" else
             f"half of the free memory holds {limit['capacity_tokens']:,} tokens of this model's KV cache")
    fix = ("raise kv_cache_gib" if cfg.backend == "vllm" else "free memory") + " or lower max_new_tokens"
    return (f"NOTE: batch_size={cfg.batch_size} is more than memory holds here: {where}, and a request may reach "
            f"{limit['tokens_per_request']:,} (prompt + max_new_tokens={cfg.max_new_tokens}), so as few as "
            f"{max(1, limit['in_flight'])} ran at once; {fix} to run {cfg.batch_size} (finished documents are kept "
            "either way)")


def _report(cfg: ReadConfig, summary: dict[str, Any], tally: Tally, survey: _Survey, out_path: Path,
            seconds: float) -> None:
    """The run's lines on stdout: what was read, then every warning and note."""
    stats, failed, single_chunk, empty = tally.stats, tally.failed, tally.single_chunk, survey.empty
    print(
        f"read: {summary['read']} docs in {seconds:.1f}s ({summary['docs_per_s']} docs/s), "
        f"{survey.n_done} already done, "
        f"{stats['guided']} guided / {stats['unguided']} unguided, {len(failed)} failed, "
        f"{summary['truncated_skipped']} cut off and skipped, {stats['repaired']} repaired, "
        f"{stats['fallbacks']} whole-document fallbacks → {out_path}"
    )
    warn_unwritten(failed, summary["truncated_skipped"], cfg.max_new_tokens)
    if tally.memory_limit:
        print(memory_limit_note(cfg, tally.memory_limit))
    if stats["windowed"]:
        print(f"NOTE: {stats['windowed']} long document(s) were read in {stats['windows']} windows and merged "
              f"(window_tokens={cfg.window_tokens or 'auto'}, overlap_tokens={cfg.overlap_tokens}; meta.windows)")
    if single_chunk:
        print(f"NOTE: {len(single_chunk)} document(s) had no chunk boundary in range and are one chunk each: "
              f"{single_chunk[:5]} (lower min_chunk_chars to cut them)")
    if stats["fallbacks"]:
        print(f"WARNING: {stats['fallbacks']} document(s) had no usable memory output and were kept as ONE chunk")
    if empty:
        print(f"NOTE: {len(empty)} document(s) with empty text were skipped (no model call): {empty[:5]}")


STAGE = Stage("read", "MemReader batch reading of a corpus (resumable)", run=read_corpus_memories, config=ReadConfig,
              example_dir="configs/inference/", models=lambda c: {} if c.backend == "openai" else {"model": c.model})

if __name__ == "__main__":
    from memreader.cli import module_main

    raise SystemExit(module_main("read"))
