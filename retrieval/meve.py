"""MeVe: memory verification and context control in five auditable phases (Ottem, 2025).

    pipeline = MeVePipeline(source, embedder, verifier, tokenizer, MeVeSettings())
    result = pipeline.run("Which magazine was started first, Arthur's Magazine or First for Women?")
    result.context        # the passages that survived, joined by SEPARATOR, <= t_max tokens
    result.audit          # every candidate of every phase, with its score and why it was dropped

``source`` is a :class:`~memreader.retrieval.passages.PassageStore` or a :class:`MemoryChunkSource`; ``verifier``
one of :mod:`memreader.retrieval.verifier`; ``tokenizer`` the answering model's (the budget is in its tokens).
Phases (kNN, verify, fallback, prioritise, pack), the work beside the verifier, packing and the ablation switches:
docs/MEVE.md (The five phases, Ablation switches).
"""

from __future__ import annotations

import inspect
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from memreader.core.config import range_problems
from memreader.core.embedders import encode
from memreader.retrieval.meve_settings import DEFAULT_OPERATING_POINT, PAPER_SETTINGS, MeVeSettings
from memreader.retrieval.meve_sources import MemoryChunkSource, MeVeError, PassageSource
from memreader.retrieval.token_counter import TokenCounter, load_tokenizer
from memreader.retrieval.verifier import Verifier

__all__ = ["DEFAULT_OPERATING_POINT", "PAPER_SETTINGS", "SEPARATOR", "Candidate", "MeVeError",
           "MeVePipeline", "MeVeResult", "MeVeSettings",
           "MemoryChunkSource", "PassageSource", "load_tokenizer"]

SEPARATOR = "\n\n"
"""What joins packed passages; its tokens count against ``t_max``."""
_SPECULATE_MS = 50.0
"""Work that does not need the verifier's scores runs beside it when the last verification took longer."""
_BOUNDARY_SLACK = 8
"""A passage whose summed count is more than this over the budget is skipped without counting the join."""


@dataclass
class Candidate:
    """One passage on its way through the phases."""

    id: str
    doc_id: str
    text: str
    source: str
    """``knn`` (phase 1) or ``bm25`` (phase 3 fallback)."""
    rank: int
    """Rank in the list it came from."""
    similarity: float
    """Cosine with the question (``knn``) or BM25 score (``bm25``)."""
    score: float = 0.0
    """Priority score: the verifier's (or the cosine with verify=false), rank-based for fallback passages."""
    verifier_score: float | None = None
    tokens: int | None = None
    """The passage's own tokens in the budget tokenizer (set in phase 5)."""
    vector: np.ndarray | None = None
    where: dict[str, Any] | None = None
    """Source file, pages and heading path of the passage, when the store knows them."""

    def brief(self, **extra: Any) -> dict[str, Any]:
        """The audit entry of this candidate."""
        out = {"id": self.id, "doc_id": self.doc_id, "source": self.source, "rank": self.rank,
               "similarity": round(self.similarity, 6), "score": round(self.score, 6)}
        if self.verifier_score is not None:
            out["verifier_score"] = round(self.verifier_score, 6)
        if self.tokens is not None:
            out["tokens"] = self.tokens
        if self.where:
            out["where"] = self.where
        return {**out, **extra}


@dataclass
class MeVeResult:
    """The packed context, the passages in it (priority order) and the audit record."""

    context: str
    passages: list[Candidate]
    audit: dict[str, Any]

    @property
    def tokens(self) -> int:
        """Tokens of :attr:`context` in the budget tokenizer."""
        return int(self.audit["tokens"])

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON: context, passages (without vectors) and the audit."""
        return {"context": self.context,
                "passages": [{k: v for k, v in asdict(c).items() if k != "vector"} for c in self.passages],
                "audit": self.audit}


def _timed(fn: Any, *args: Any) -> tuple[Any, float]:
    """``fn(*args)`` and the milliseconds it took."""
    start = time.perf_counter()
    return fn(*args), _ms(start)


def _ms(start: float) -> float:
    return round((time.perf_counter() - start) * 1000.0, 3)


class MeVePipeline:
    """The five phases over one passage source (see the module docstring)."""

    def __init__(self, source: PassageSource, embedder: Any, verifier: Verifier | None, tokenizer: Any,
                 settings: MeVeSettings | None = None) -> None:
        self.settings = settings or MeVeSettings()
        problems = range_problems(self.settings) + self.settings.meve_problems()
        if self.settings.verify and verifier is None:
            problems.append("verify=true needs a verifier (see memreader.retrieval.verifier.build_verifier), or set verify=false")
        if problems:
            raise MeVeError("MeVe settings cannot be used:\n  - " + "\n  - ".join(problems))
        self.source, self.embedder, self.verifier, self.tokenizer = source, embedder, verifier, tokenizer
        self.counter = TokenCounter(tokenizer)
        # a store that counted its passages in this tokenizer at build time spares counting them per question
        key = getattr(source, "token_key", None)
        self._token_key = key if key is not None and key == self.counter.key else None
        # a source whose knn takes with_vectors (PassageStore) can leave the vectors to the read beside the verifier
        self._knn_skips_vectors = "with_vectors" in inspect.signature(source.knn).parameters
        # what a separator adds between two passages (its tokens can differ inside text from on its own)
        count = self.counter.count
        self._sep_between = count("a" + SEPARATOR + "b") - count("a") - count("b")
        self._sep_tokens = max(count(SEPARATOR), self._sep_between)
        self._pool: ThreadPoolExecutor | None = None
        # whether the verifier is slow enough to hide work behind: until measured, a verifier that runs a model
        self._last_verifier_ms = 0.0 if getattr(verifier, "wants_similarities", False) else float("inf")

    def _beside_verifier(self) -> bool:
        """Whether phase 2 runs a model slow enough that independent work should run beside it."""
        return bool(self.settings.verify and self.verifier is not None and self._last_verifier_ms > _SPECULATE_MS)

    def _submit(self, fn: Any, *args: Any) -> Future:
        self._pool = self._pool or ThreadPoolExecutor(max_workers=1, thread_name_prefix="meve-beside-verifier")
        return self._pool.submit(fn, *args)

    def _prefetch(self, found: list[Candidate]) -> dict[str, np.ndarray]:
        """Beside the verifier: the stored vectors phase 4 needs and the token counts phase 5 needs."""
        self.counter.counts([c.text for c in found if c.tokens is None])
        return self.source.vectors([c.id for c in found if c.vector is None]) if self.settings.prioritize else {}

    def _bm25_counted(self, question: str, k: int) -> tuple[list[Any], float]:
        """Beside the verifier: the fallback's search and its milliseconds, its passages then counted for phase 5."""
        hits, search_ms = _timed(self.source.bm25, question, k)
        self.counter.counts([h.text for h in hits])
        return hits, search_ms

    def _check_question(self, question: str) -> None:
        if not isinstance(question, str) or not question.strip():
            raise MeVeError("the question is empty", "ask a question")
        n = self.counter.count(question)
        if n > self.settings.t_max:
            raise MeVeError(f"the question is {n} tokens, over the context budget t_max={self.settings.t_max}",
                            "shorten the question or raise t_max")

    def candidates(self, question: str) -> list[Candidate]:
        """Phase 1 alone: the ``k`` nearest passages as candidates (what :meth:`finish` takes)."""
        vector = encode(self.embedder, [question], batch_size=1, kind="query")[0]
        # beside a slow verifier the vectors are read while it runs, off the critical path
        skip = {"with_vectors": False} if self._knn_skips_vectors and self._beside_verifier() else {}
        return [self._candidate(h, "knn") for h in self.source.knn(vector.tolist(), self.settings.k, **skip)]

    def _candidate(self, hit: Any, source: str, **scores: Any) -> Candidate:
        """A search hit as a candidate, with its stored vector and (when the store counted in this pipeline's budget
        tokenizer) its token count."""
        return Candidate(hit.id, hit.doc_id, hit.text, source, hit.rank, hit.score, where=hit.where,
                         tokens=getattr(hit, "tokens", None) if self._token_key is not None else None,
                         vector=None if hit.vector is None else np.asarray(hit.vector, dtype=np.float32), **scores)

    def run(self, question: str) -> MeVeResult:
        """Run the five phases for ``question``; the audit says what each phase did and why."""
        started = time.perf_counter()
        self._check_question(question)
        t = time.perf_counter()
        found = self.candidates(question)
        return self.finish(question, found, {"knn": _ms(t)}, started)

    def finish(self, question: str, found: list[Candidate], ms: dict[str, float] | None = None,
               started: float | None = None) -> MeVeResult:
        """Phases 2-5 over phase 1's candidates ``found`` (fresh ones: the phases set their scores). A calibration
        runs many settings over the same candidates this way, without searching again."""
        s = self.settings
        started = time.perf_counter() if started is None else started
        ms = dict(ms or {"knn": 0.0})
        audit: dict[str, Any] = {"question": question, "settings": s.meve_settings(),
                                 "operating_point": s.point_note(),
                                 "signature": s.signature(getattr(self.verifier, "name", None),
                                                          getattr(self.verifier, "choice", None)),
                                 "verifier": getattr(self.verifier, "name", None) if s.verify else None,
                                 "verifier_engine": getattr(self.verifier, "choice", None) if s.verify else None,
                                 "knn": {"k": s.k, "candidates": [c.brief() for c in found]}}
        # a verifier that runs a model takes far longer than reading vectors, counting tokens or one BM25 search: they
        # start beside it (the search is used only if the fallback fires), so their time leaves the critical path
        prefetch = pending = None
        if found and self._beside_verifier():
            prefetch = self._submit(self._prefetch, found)
            if s.fallback and s.fallback_beside_verifier and s.n_min > 0:
                pending = self._submit(self._bm25_counted, question, s.fallback_k + len(found))
        try:
            kept, verifier_ms = self._verify(question, found, audit, ms)
            self._last_verifier_ms = verifier_ms
            if prefetch is not None:  # the source's client is used by one thread at a time
                wait([prefetch])
            extra = self._fallback(question, found, kept, audit, ms, pending)
            ordered = self._prioritize(kept + extra, audit, ms, prefetch)
        finally:  # whatever failed, the reads must not outlive the question on a shared client
            wait([f for f in (prefetch, pending) if f is not None and not f.cancel()])
        packed, context, tokens = self._pack(ordered, audit, ms, found)

        total = _ms(started)
        ms.update(total=total, verifier=verifier_ms, total_without_verifier=round(total - verifier_ms, 3))
        audit.update(ms=ms, tokens=tokens, final=[c.id for c in packed])
        return MeVeResult(context=context, passages=packed, audit=audit)

    def _verify(self, question: str, found: list[Candidate], audit: dict[str, Any],
                ms: dict[str, float]) -> tuple[list[Candidate], float]:
        s = self.settings
        t = time.perf_counter()
        if not s.verify:
            for c in found:
                c.score = c.similarity
            ms["verify"] = _ms(t)
            audit["verify"] = {"enabled": False, "kept": [c.brief() for c in found], "dropped": []}
            return list(found), 0.0
        v = time.perf_counter()
        texts = [c.text for c in found]
        if not found:
            scores = []
        elif getattr(self.verifier, "wants_similarities", False):  # the embedding verifier: phase 1's cosines
            scores = self.verifier.score(question, texts, similarities=[c.similarity for c in found])
        else:
            scores = self.verifier.score(question, texts)
        verifier_ms = _ms(v)
        if len(scores) != len(found) or not all(0.0 <= x <= 1.0 for x in scores):
            raise MeVeError(f"verifier {getattr(self.verifier, 'name', '?')} returned {len(scores)} scores for "
                            f"{len(found)} passages (each must lie in [0, 1])", "fix the verifier")
        kept, dropped = [], []
        for c, x in zip(found, scores, strict=True):
            c.score = c.verifier_score = float(x)
            if x >= s.tau:
                kept.append(c)
            else:
                dropped.append(c.brief(reason=f"below tau: {x:.3f} < {s.tau}"))
        ms["verify"] = _ms(t)
        audit["verify"] = {"enabled": True, "tau": s.tau, "verifier_ms": verifier_ms,
                           "kept": [c.brief() for c in kept], "dropped": dropped}
        return kept, verifier_ms

    def _fallback(self, question: str, found: list[Candidate], kept: list[Candidate], audit: dict[str, Any],
                  ms: dict[str, float], pending: Future | None = None) -> list[Candidate]:
        s = self.settings
        t = time.perf_counter()
        fires = s.fallback and len(kept) < s.n_min
        why = (f"{len(kept)} kept < n_min {s.n_min}" if fires else
               "disabled" if not s.fallback else f"{len(kept)} kept >= n_min {s.n_min}")
        extra: list[Candidate] = []
        search = None
        if pending is not None:  # started beside the verifier (done by now, unless BM25 was the slower one)
            wait([pending])
            if pending.exception() is None:
                found_hits, search = pending.result()
            elif fires:
                raise pending.exception()
            # a failed search the fallback does not need fails nothing (the sequential order would not have run it)
        if fires:
            have = {c.id for c in kept}
            scored = {c.id: c.verifier_score for c in found}
            if search is None:
                found_hits, search = _timed(self.source.bm25, question, s.fallback_k + len(have))
            hits = [h for h in found_hits if h.id not in have]
            extra = [self._candidate(h, "bm25", score=s.tau * (s.fallback_k + 1 - j) / (s.fallback_k + 1),
                                     verifier_score=scored.get(h.id)) for j, h in enumerate(hits[: s.fallback_k], 1)]
        ms["fallback"] = _ms(t)
        audit["fallback"] = {"enabled": s.fallback, "fired": fires, "reason": why,
                             "added": [c.brief() for c in extra],
                             "search": None if search is None else {"ms": search, "beside_verifier": pending is not None,
                                                                    "used": fires}}
        return extra

    def _prioritize(self, combined: list[Candidate], audit: dict[str, Any], ms: dict[str, float],
                    prefetch: Future | None = None) -> list[Candidate]:
        s = self.settings
        t = time.perf_counter()
        if prefetch is not None and any(c.vector is None for c in combined):
            stored = prefetch.result()  # read beside the verifier: a failure is the failure of the read it replaces
            for c in combined:
                c.vector = stored.get(c.id) if c.vector is None else c.vector
        if not s.prioritize:
            ms["prioritize"] = _ms(t)
            audit["prioritize"] = {"enabled": False, "order": [c.brief() for c in combined], "dropped": []}
            return combined
        ordered = sorted(combined, key=lambda c: -c.score)  # stable: ties keep phase order
        missing = [c.id for c in ordered if c.vector is None]
        if missing:
            stored = self.source.vectors(missing)
            for c in ordered:
                if c.vector is None:
                    c.vector = stored[c.id]
        kept: list[Candidate] = []
        dropped = []
        for c in ordered:
            if kept:
                sims = np.stack([k.vector for k in kept]) @ c.vector
                j = int(np.argmax(sims))
                if float(sims[j]) > s.redundancy:
                    dropped.append(c.brief(reason=f"redundant with {kept[j].id} at cos {float(sims[j]):.3f} > "
                                                  f"{s.redundancy}", redundant_with=kept[j].id,
                                           cosine=round(float(sims[j]), 6)))
                    continue
            kept.append(c)
        ms["prioritize"] = _ms(t)
        audit["prioritize"] = {"enabled": True, "redundancy": s.redundancy, "order": [c.brief() for c in kept],
                               "dropped": dropped}
        return kept

    def _fit(self, ordered: list[Candidate], budget: int | None = None, exact: bool = False
             ) -> tuple[list[Candidate], list[dict[str, Any]], int | None]:
        """Greedy first fit under ``budget`` tokens (default ``t_max``). The joined text's tokens are estimated as the
        sum of the passages' own counts plus the separators' (the passages are tokenised once); only a passage whose
        estimate lands within the slack of the budget is checked by tokenising the joined text (every passage with
        ``exact``; :meth:`_pack` redoes the walk that way when the final count is over the budget). Also returns the
        packed context's exact count when the last passage packed was checked that way (else None)."""
        budget = self.settings.t_max if budget is None else budget
        packed: list[Candidate] = []
        dropped = []
        used = 0
        name = "t_max" if budget == self.settings.t_max else "budget"
        known: int | None = None
        for c in ordered:
            estimate = c.tokens if not packed else used + self._sep_tokens + c.tokens
            if not exact and estimate > budget + _BOUNDARY_SLACK:
                dropped.append(c.brief(reason=f"over budget: about {estimate} > {name} {budget} tokens",
                                       tokens_if_added=estimate))
                continue
            counted = exact or estimate > budget - _BOUNDARY_SLACK
            if counted:
                estimate = self._join_tokens([*packed, c])
                if estimate > budget:
                    dropped.append(c.brief(reason=f"over budget: {estimate} > {name} {budget} tokens",
                                           tokens_if_added=estimate))
                    continue
            packed.append(c)
            used = estimate
            known = estimate if counted else None
        return packed, dropped, known

    def _count_missing(self, passages: list[Candidate]) -> None:
        """Each passage's own tokens where neither the store nor an earlier phase gave them (one batch)."""
        todo = [c for c in passages if c.tokens is None]
        for c, n in zip(todo, self.counter.counts([c.text for c in todo]), strict=True):
            c.tokens = n

    def budget(self, found: list[Candidate]) -> tuple[int, int | None]:
        """Phase 5's budget in tokens, and what plain top-k would hand over (None without ``budget_share``): ``t_max``,
        or with ``budget_share`` > 0 the smaller of ``t_max`` and that share of the ``k`` kNN candidates' tokens plus
        the separators between them (each passage counted once and remembered; the join is not tokenised)."""
        s = self.settings
        if not s.budget_share or not found:
            return s.t_max, None
        self._count_missing(found)
        offered = sum(int(c.tokens or 0) for c in found) + self._sep_tokens * (len(found) - 1)
        return max(1, min(s.t_max, int(s.budget_share * offered))), offered

    def _join_tokens(self, passages: list[Candidate]) -> int:
        """Exact tokens of the passages joined by :data:`SEPARATOR`: from their own counts where the tokenizer
        provably adds up across the separator (:meth:`TokenCounter.join_count`), else by tokenising the join."""
        texts = [c.text for c in passages]
        summed = self.counter.join_count(texts, [int(c.tokens or 0) for c in passages], SEPARATOR, self._sep_between)
        return summed if summed is not None and all(c.tokens is not None for c in passages) else \
            self.counter.count(SEPARATOR.join(texts))

    def _pack(self, ordered: list[Candidate], audit: dict[str, Any], ms: dict[str, float],
              found: list[Candidate] | None = None) -> tuple[list[Candidate], str, int]:
        s = self.settings
        t = time.perf_counter()
        self._count_missing(ordered)
        if not s.pack:
            context = SEPARATOR.join(c.text for c in ordered)
            tokens = self.counter.count(context) if context else 0
            ms["pack"] = _ms(t)
            audit["pack"] = {"enabled": False, "packed": [c.brief() for c in ordered], "dropped": [], "tokens": tokens}
            return list(ordered), context, tokens
        budget, offered = self.budget(found or [])
        packed, dropped, known = self._fit(ordered, budget)
        context = SEPARATOR.join(c.text for c in packed)
        used = known if known is not None else self._join_tokens(packed) if packed else 0
        if used > budget:  # the estimates were off by more than the slack: the exact walk, one count per passage
            packed, dropped, known = self._fit(ordered, budget, exact=True)
            context = SEPARATOR.join(c.text for c in packed)
            used = known if known is not None else 0
        ms["pack"] = _ms(t)
        audit["pack"] = {"enabled": True, "t_max": s.t_max, "budget_share": s.budget_share, "offered": offered,
                         "budget": budget, "separator": SEPARATOR, "packed": [c.brief() for c in packed],
                         "dropped": dropped, "tokens": used}
        return packed, context, used
