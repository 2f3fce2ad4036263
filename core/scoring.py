"""MoM evaluator scoring of document memories: atomic-chunk clarity and core-content completeness.

    scorer = EvaluatorScorer(ScorerSettings())          # embedded SmolLM2-135M-Instruct, offline
    scores = scorer.score(candidate_memories)           # one MemoryScore per memory, batched over all

Every request of a call goes through one pass of :mod:`memreader.core.scoring_engines`. Formulas, exact text
formats, truncation and why ``ppl`` / ``K = 32`` / ``CLARITY_SEP = ""``: docs/ARCHITECTURE.md (Scoring).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from memreader.core.engines import EngineChoice, canonical_backend, resolve_engine
from memreader.core.language import detect_language
from memreader.core.prompts import load_template, render
from memreader.core.schema import DocumentMemory
from memreader.core.scoring_engines import HFEngine, VLLMEngine, _Pool, _Req, _span_nll, sigmoid
from memreader.core.scoring_settings import (
    EvaluatorConfig,
    ScorerSettings,
    ScoringError,
    check_variants,
)

#: The answer words of the ``chunk_boundary`` template: (boundary, no boundary).
ANSWER_WORDS = ("split", "keep")
#: Bump when a text format, a truncation rule or a formula above changes (it is in every score).
FORMAT_VERSION = 1
CLARITY_SEP = ""  # chunks are exact document slices: context + target is the document text itself
CORE_SEP = "\n"
#: Scale of the log-perplexity gain inside the ``ppl`` sigmoid (nats).
PPL_TEMPERATURE = 1.0
SINGLE_CHUNK_CLARITY = {"prob": 0.5, "margin": 0.0, "ppl": 0.5}


@dataclass
class MemoryScore:
    """Scores of one memory, with everything needed to audit or recompute them."""

    doc_id: str
    clarity: float
    completeness: float | None
    variant: str
    boundaries: list[float]
    chunk_terms: list[float] | None
    chunk_ppl: list[float | None] | None
    single_chunk: bool
    evaluator: str
    prompt_version: str
    clarity_variants: dict[str, float] = field(default_factory=dict)
    boundary_variants: dict[str, list[float]] = field(default_factory=dict)
    #: raw per-boundary quantities: ``nll_cond``/``nll_uncond`` (ppl), ``p_split``/``p_keep`` (prob, margin)
    boundary_details: dict[str, list[float]] = field(default_factory=dict)
    core_tokens: list[int] | None = None
    format_version: int = FORMAT_VERSION
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (plain floats, ints, strings, lists and dicts)."""
        return asdict(self)


def answer_token_ids(tokenizer: Any, words: Sequence[str] | None = None) -> list[int]:
    """The single token id of each answer word (default :data:`ANSWER_WORDS`), or :class:`ScoringError`
    naming the words that are not one token."""
    words = ANSWER_WORDS if words is None else words
    ids = [tokenizer.encode(w, add_special_tokens=False) for w in words]
    bad = {w: i for w, i in zip(words, ids, strict=True) if len(i) != 1}
    if bad:
        raise ScoringError(
            "the evaluator tokenizer does not encode the answer word(s) "
            + ", ".join(f"{w!r} (as {len(i)} tokens {i})" for w, i in bad.items())
            + " as one token each, so P(split)/P(keep) cannot be read from one next-token distribution",
            "use clarity_variant='ppl', or an evaluator whose tokenizer has these words as single tokens, or "
            "change ANSWER_WORDS in core/scoring.py together with the chunk_boundary templates (bump their version)",
        )
    return [i[0] for i in ids]


# ---------------------------------------------------------------------------------------------
# Planning: the token sequences of one memory.


class _Texts:
    """Tokenizer helper: cached piecewise encoding, BOS prefix, separators, truncation."""

    def __init__(self, tokenizer: Any, max_chunk_tokens: int) -> None:
        self.tok = tokenizer
        self.max = max_chunk_tokens
        bos = getattr(tokenizer, "bos_token_id", None)
        self.prefix: list[int] = [int(bos)] if bos is not None else []
        self._cache: dict[str, list[int]] = {}

    def encode_many(self, texts: Sequence[str]) -> None:
        todo = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if todo:
            for text, ids in zip(todo, self.tok(todo, add_special_tokens=False)["input_ids"], strict=True):
                self._cache[text] = list(ids)

    def enc(self, text: str) -> list[int]:
        if text not in self._cache:
            self._cache[text] = list(self.tok(text, add_special_tokens=False)["input_ids"])
        return self._cache[text]

    def head(self, text: str) -> tuple[list[int], str]:
        """First ``max`` tokens and the text they stand for (the text itself when not truncated)."""
        ids = self.enc(text)
        return (ids, text) if len(ids) <= self.max else (ids[: self.max], self.tok.decode(ids[: self.max]))

    def tail(self, text: str) -> tuple[list[int], str]:
        """Last ``max`` tokens and the text they stand for."""
        ids = self.enc(text)
        return (ids, text) if len(ids) <= self.max else (ids[-self.max :], self.tok.decode(ids[-self.max :]))


@dataclass
class _Boundary:
    ppl_cond: tuple[_Req, int, int] | None = None
    ppl_uncond: tuple[_Req, int, int] | None = None
    prompt: _Req | None = None


@dataclass
class _Chunk:
    core_tokens: int
    comp: tuple[_Req, int, int] | None = None


class _Planner:
    """Builds the requests of boundaries and chunks into one pool."""

    def __init__(self, tokenizer: Any, settings: ScorerSettings) -> None:
        self.settings = settings
        self.t = _Texts(tokenizer, settings.max_chunk_tokens)
        self.pool = _Pool()
        k = settings.ppl_target_tokens
        self.ppl_tokens = min(k, settings.max_chunk_tokens) if k else settings.max_chunk_tokens
        self.skip = 0 if self.t.prefix else 1  # no BOS: the first token of a context-free target is unscorable

    def boundary(self, first: str, second: str, lang: str, ppl: bool, prompt: bool) -> _Boundary:
        t, out = self.t, _Boundary()
        if ppl:
            ctx_ids = t.tail(first)[0]
            tgt_all = t.enc(second)[: self.ppl_tokens]
            sep = t.enc(CLARITY_SEP)
            cond = [*t.prefix, *ctx_ids, *sep, *tgt_all]
            start = len(cond) - len(tgt_all)
            out.ppl_cond = self.pool.span(cond, start + self.skip, len(cond))
            uncond = [*t.prefix, *tgt_all]
            out.ppl_uncond = self.pool.span(uncond, len(t.prefix) + self.skip, len(uncond))
        if prompt:
            messages, _ = render("chunk_boundary", lang, first=t.tail(first)[1], second=t.head(second)[1])
            text = t.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            out.prompt = self.pool.answer(t.tok(text, add_special_tokens=False)["input_ids"])
        return out

    def chunk(self, core: str, chunk: str) -> _Chunk:
        t = self.t
        if not core.strip():
            return _Chunk(core_tokens=0)
        core_ids = t.head(core)[0]
        tgt_ids = t.head(chunk)[0]
        ids = [*t.prefix, *core_ids, *t.enc(CORE_SEP), *tgt_ids]
        out = _Chunk(core_tokens=len(t.enc(core)))
        out.comp = self.pool.span(ids, len(ids) - len(tgt_ids), len(ids))
        return out


@dataclass
class _MemoryPlan:
    memory: DocumentMemory
    lang: str
    boundaries: list[_Boundary]
    chunks: list[_Chunk] | None  # None: chunk-only memory (every core empty)


def _plan_memory(planner: _Planner, mem: DocumentMemory, variants: Sequence[str]) -> _MemoryPlan:
    chunks, cores = mem.chunks, mem.cores
    planner.t.encode_many([*chunks, *cores])
    lang = detect_language(mem.document)
    ppl = "ppl" in variants
    prompt = "prob" in variants or "margin" in variants
    bounds = [planner.boundary(chunks[i], chunks[i + 1], lang, ppl, prompt) for i in range(len(chunks) - 1)]
    comp = None
    if any(c.strip() for c in cores):
        comp = [planner.chunk(c, a) for c, a in zip(cores, chunks, strict=True)]
    return _MemoryPlan(mem, lang, bounds, comp)


# ---------------------------------------------------------------------------------------------
# The scorer.


class EvaluatorScorer:
    """Scores memories (and raw boundary / core pairs) with one evaluator LM, batched over everything."""

    def __init__(self, settings: ScorerSettings, model: Any = None, tokenizer: Any = None, engine: Any = None) -> None:
        """``model`` + ``tokenizer``: already loaded transformers weights; ``engine``: an already started
        :class:`memreader.core.vllm_engine.Engine`; neither: the engine :func:`memreader.core.engines.resolve_engine`
        chooses for the stage ``scorer`` from the settings, its weights shared with any stage that loaded the same
        model, dtype and device (the process's caches)."""
        self.settings = settings
        self._answer_ids: list[int] | None = None
        if (model is None) != (tokenizer is None):
            raise ScoringError("EvaluatorScorer got only one of model and tokenizer", "pass both, or neither")
        if model is not None and engine is not None:
            raise ScoringError("EvaluatorScorer got both a model and a vLLM engine", "pass one of them")
        if model is None and engine is None:
            self.choice = resolve_engine("scorer", settings.evaluator_backend, settings.evaluator_dtype,
                                         settings.evaluator_device)
        else:
            backend = "vllm" if engine is not None else "transformers"
            if canonical_backend(settings.evaluator_backend) not in ("auto", backend):
                raise ScoringError(f"evaluator_backend={settings.evaluator_backend!r}, but the scorer was given a "
                                   f"{'vLLM engine' if engine is not None else 'transformers model'}",
                                   "pass neither (the scorer loads its own), or set evaluator_backend=auto")
            self.choice = EngineChoice("scorer", backend, "", "", "given")
        if self.choice.backend == "vllm":
            # ``engine``: an already started memreader.core.vllm_engine.Engine, else the process's one for this spec
            self.engine: HFEngine | VLLMEngine = VLLMEngine(settings.evaluator, dtype=self.choice.dtype or "auto",
                                                            max_model_len=settings.max_model_len, engine=engine)
            self.tokenizer, self.dtype_name, self.evaluator = self.engine.tokenizer, self.engine.dtype, settings.evaluator
            self.choice = replace(self.choice, dtype=str(self.dtype_name))
            return
        if model is None:
            from memreader.core.runtime import runtime, shared_causal_lm

            shared = shared_causal_lm(settings.evaluator, rt=runtime(self.choice.device, self.choice.dtype))
            model, tokenizer = shared.model, shared.tokenizer
            self.evaluator = settings.evaluator
        else:
            self.evaluator = getattr(model, "name_or_path", "") or settings.evaluator
        self.model, self.tokenizer = model, tokenizer
        param = next(model.parameters())
        self.dtype_name = str(param.dtype).replace("torch.", "")
        self.choice = replace(self.choice, dtype=self.dtype_name, device=self.choice.device or param.device.type)
        self.engine = HFEngine(model, tokenizer, settings.evaluator_batch_tokens, settings.slice_tokens,
                               settings.max_pad_fraction)

    def answer_ids(self) -> list[int]:
        """Token ids of :data:`ANSWER_WORDS` (checked once)."""
        if self._answer_ids is None:
            self._answer_ids = answer_token_ids(self.tokenizer)
        return self._answer_ids

    def _run(self, planner: _Planner, prompts: bool) -> None:
        answer_ids = self.answer_ids() if prompts else None
        self.engine.run(planner.pool.physical(), answer_ids)

    def _settings_record(self) -> dict[str, Any]:
        s = self.settings
        return {"max_chunk_tokens": s.max_chunk_tokens, "ppl_target_tokens": s.ppl_target_tokens,
                "ppl_temperature": PPL_TEMPERATURE, "backend": self.choice.backend, "dtype": self.dtype_name,
                "clarity_sep": CLARITY_SEP, "core_sep": CORE_SEP, "answer_words": list(ANSWER_WORDS)}

    def signature(self) -> dict[str, Any]:
        """What a score depends on besides the memory: evaluator, variant, text format and settings
        (the score cache keys on it, so changing any of them rescores)."""
        return {"evaluator": self.evaluator, "variant": self.settings.clarity_variant,
                "format_version": FORMAT_VERSION, **self._settings_record(),
                "templates": [load_template("chunk_boundary", lang).id for lang in ("en", "zh")]}

    # -- values from computed requests

    def _boundary_values(self, b: _Boundary) -> dict[str, float]:
        out: dict[str, float] = {}
        if b.ppl_cond is not None and b.ppl_uncond is not None:
            cond, unc = _span_nll(b.ppl_cond), _span_nll(b.ppl_uncond)
            if len(unc) and len(cond) == len(unc):
                out["nll_cond"], out["nll_uncond"] = float(cond.mean()), float(unc.mean())
                out["ppl"] = sigmoid((out["nll_cond"] - out["nll_uncond"]) / PPL_TEMPERATURE)
            else:  # nothing to score (no BOS and a one-token successor): no evidence
                out["nll_cond"] = out["nll_uncond"] = 0.0
                out["ppl"] = SINGLE_CHUNK_CLARITY["ppl"]
        if b.prompt is not None:
            req = b.prompt
            p_split, p_keep = req.phys.ans[len(req.ids) - 1]
            out["p_split"], out["p_keep"] = p_split, p_keep
            total = p_split + p_keep
            out["prob"] = p_split / total if total > 0 else 0.5
            out["margin"] = p_split - p_keep
        return out

    @staticmethod
    def _chunk_values(c: _Chunk) -> tuple[float, float | None]:
        if c.comp is None:
            return 0.0, None
        ppl = math.exp(float(_span_nll(c.comp).mean()))
        return 1.0 / (ppl * math.log(max(c.core_tokens, 2))), ppl

    # -- public API

    def score(self, memories: Sequence[DocumentMemory], variants: Sequence[str] | None = None) -> list[MemoryScore]:
        """One :class:`MemoryScore` per memory, all memories in one batched pass.

        ``variants`` (default: ``settings.clarity_variant``): the first is the score's ``variant`` /
        ``clarity`` / ``boundaries``; all of them are in ``clarity_variants`` and ``boundary_variants``.
        """
        variants = check_variants(list(variants) if variants is not None else [self.settings.clarity_variant])
        planner = _Planner(self.tokenizer, self.settings)
        plans = [_plan_memory(planner, m, variants) for m in memories]
        prompts = "prob" in variants or "margin" in variants
        self._run(planner, prompts)
        record = self._settings_record()
        results = []
        for plan in plans:
            values = [self._boundary_values(b) for b in plan.boundaries]
            single = not values
            per_variant = {v: [row[v] for row in values] for v in variants}
            clarity = {v: (float(np.mean(per_variant[v])) if values else SINGLE_CHUNK_CLARITY[v]) for v in variants}
            details = {k: [row[k] for row in values] for k in ("nll_cond", "nll_uncond", "p_split", "p_keep")
                       if values and k in values[0]}
            terms = ppls = core_tokens = completeness = None
            if plan.chunks is not None:
                terms, ppls = map(list, zip(*(self._chunk_values(c) for c in plan.chunks), strict=True))
                core_tokens = [c.core_tokens for c in plan.chunks]
                completeness = float(np.mean(terms))
            primary = variants[0]
            version = f"plain@{FORMAT_VERSION}"
            if prompts:
                version = f"{load_template('chunk_boundary', plan.lang).id};{version}"
            results.append(MemoryScore(
                doc_id=plan.memory.doc_id, clarity=clarity[primary], completeness=completeness, variant=primary,
                boundaries=per_variant[primary], chunk_terms=terms, chunk_ppl=ppls, single_chunk=single,
                evaluator=self.evaluator, prompt_version=version, clarity_variants=clarity,
                boundary_variants=per_variant, boundary_details=details, core_tokens=core_tokens, settings=record,
            ))
        return results

    def boundary_variants(self, pairs: Sequence[tuple[str, str]], variants: Sequence[str]) -> dict[str, list[float]]:
        """``b(first, second)`` of each variant for each (text before, text after) pair, batched in one pass
        (``prob`` and ``margin`` share their prompts)."""
        variants = check_variants(list(variants))
        ppl, prompts = "ppl" in variants, "prob" in variants or "margin" in variants
        planner = _Planner(self.tokenizer, self.settings)
        planner.t.encode_many([x for pair in pairs for x in pair])
        bounds = [planner.boundary(a, b, detect_language(a + b), ppl, prompts) for a, b in pairs]
        self._run(planner, prompts)
        values = [self._boundary_values(b) for b in bounds]
        return {v: [row[v] for row in values] for v in variants}

    def boundary_nlls(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per-token NLLs ``(of second given first, of second alone)`` behind the ``ppl`` variant, per pair."""
        planner = _Planner(self.tokenizer, self.settings)
        planner.t.encode_many([x for pair in pairs for x in pair])
        bounds = [planner.boundary(a, b, "en", True, False) for a, b in pairs]
        self._run(planner, False)
        return [(_span_nll(b.ppl_cond), _span_nll(b.ppl_uncond)) for b in bounds]  # type: ignore[arg-type]

    def completeness_terms(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """``1 / (PPL(chunk | core) · log(max(|core|, 2)))`` for each (core, chunk) pair (0 for an empty core)."""
        planner = _Planner(self.tokenizer, self.settings)
        planner.t.encode_many([x for pair in pairs for x in pair])
        chunks = [planner.chunk(core, chunk) for core, chunk in pairs]
        self._run(planner, False)
        return [self._chunk_values(c)[0] for c in chunks]


def evaluator_scorer(cfg: EvaluatorConfig, **settings: Any) -> EvaluatorScorer:
    """The scorer of a stage config's evaluator keys (gen, assess, eval), sharing another stage's weights or engine
    of the same model, dtype and device; ``settings``: more :class:`ScorerSettings` (eval: its answerer's
    ``max_model_len``). A ``prob``/``margin`` evaluator without one-token answer words is refused here, at once."""
    scorer = EvaluatorScorer(ScorerSettings.of(cfg, **settings))
    if cfg.clarity_variant in ("prob", "margin"):
        scorer.answer_ids()
    return scorer
