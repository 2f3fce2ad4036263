"""Calibrated MeVe verifiers: a threshold tau that means the same from one question to the next.

    verifier = calibrate(build_verifier("lm", "smollm2-135m-instruct"), "content_free")
    verifier = calibrate(EmbeddingVerifier(), "query")
    scores = verifier.score(question, passages, similarities=cosines)   # MeVe passes phase 1's cosines

:func:`calibrate` removes a verifier's question and prompt bias from its raw score (``margins``) before the sigmoid
(``none``, ``content_free``, ``query``); :class:`EmbeddingVerifier` scores with phase 1's cosines, no model call.
Why and the formulas: docs/MEVE.md (Calibrated verifiers and the operating point); the point itself is chosen by
:mod:`memreader.retrieval.meve_calibration`.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from memreader.retrieval.verifier import VERIFIER_BATCH, VerifierError, _check_input, build_verifier, sigmoid

__all__ = ["CALIBRATIONS", "CONTENT_FREE", "CalibratedVerifier", "EmbeddingVerifier", "build_meve_verifier",
           "calibrate", "calibrated_margins"]

CALIBRATIONS = ("none", "content_free", "query")
CONTENT_FREE = "N/A"
"""The content-free passage of contextual calibration (the string Zhao et al. use)."""
_MIN_STD = 1e-6


def calibrated_margins(mode: str, raw: Sequence[float], base: float | None = None) -> list[float]:
    """One question's raw scores calibrated by ``mode`` (``base``: the raw score of the content-free passage, for
    ``content_free``); the sigmoid of each is the calibrated score."""
    if mode == "content_free":
        if base is None:
            raise VerifierError("content_free calibration needs the content-free passage's raw score")
        return [x - base for x in raw]
    if mode == "query":
        mean = statistics.fmean(raw) if raw else 0.0
        std = max(statistics.pstdev(raw), _MIN_STD) if len(raw) > 1 else 1.0
        return [(x - mean) / std for x in raw]
    if mode == "none":
        return list(raw)
    raise VerifierError(f"verifier_calibration {mode!r} is not one of {', '.join(CALIBRATIONS)}")


class EmbeddingVerifier:
    """Relevance = the cosine between question and passage embeddings (phase 1's, passed as ``similarities``)."""

    name = "embedding cosine"
    wants_similarities = True
    """MeVe passes each candidate's phase-1 cosine, so this verifier costs nothing."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.choice: dict[str, Any] = {"stage": "verifier", "backend": "phase-1 cosine", "dtype": "-"}

    def margins(self, question: str, passages: Sequence[str], similarities: Sequence[float] | None = None) -> list[float]:
        """The cosines: the given ``similarities``, one per passage."""
        _check_input(question, passages)
        if similarities is None:
            raise VerifierError("the embedding verifier was given no similarities",
                                "pass similarities= (phase 1's cosines, as MeVe does)")
        if len(similarities) != len(passages):
            raise VerifierError(f"{len(similarities)} similarities for {len(passages)} passages")
        return [float(x) for x in similarities]

    def score(self, question: str, passages: Sequence[str], similarities: Sequence[float] | None = None) -> list[float]:
        """The cosine clipped to [0, 1]."""
        return [min(1.0, max(0.0, x)) for x in self.margins(question, passages, similarities)]


class CalibratedVerifier:
    """A verifier whose raw scores are calibrated per question before the sigmoid (see the module)."""

    def __init__(self, inner: Any, mode: str) -> None:
        if mode not in CALIBRATIONS:
            raise VerifierError(f"verifier_calibration {mode!r} is not one of {', '.join(CALIBRATIONS)}",
                                "content_free (contextual calibration), query (normalised per question) or none")
        if not callable(getattr(inner, "margins", None)):
            raise VerifierError(f"verifier {getattr(inner, 'name', inner)!r} gives no raw scores (margins) to "
                                "calibrate", "use a verifier of memreader.retrieval.verifier, or verifier_calibration=none")
        if mode == "content_free" and isinstance(inner, EmbeddingVerifier):
            raise VerifierError("verifier_calibration=content_free needs a model that reads the passage; the "
                                "embedding verifier's cosines have no content-free reading",
                                "use verifier_calibration=query (or none) with verifier_kind=embedding")
        self.inner, self.mode = inner, mode
        self.name = inner.name  # the mode is in MeVe's settings and signature
        self.wants_similarities = bool(getattr(inner, "wants_similarities", False))
        self.choice = getattr(inner, "choice", None)

    @property
    def seconds(self) -> float:
        return float(self.inner.seconds)

    def _raw(self, question: str, passages: Sequence[str], similarities: Sequence[float] | None,
             extra: Sequence[str] = ()) -> list[float]:
        if self.wants_similarities:
            return self.inner.margins(question, passages, similarities)
        return self.inner.margins(question, [*passages, *extra])

    def margins(self, question: str, passages: Sequence[str], similarities: Sequence[float] | None = None) -> list[float]:
        """The calibrated raw scores (the logits of :meth:`score`)."""
        if not passages:
            _check_input(question, passages)
            return []
        if self.mode == "content_free":
            *raw, base = self._raw(question, passages, similarities, extra=(CONTENT_FREE,))
            return calibrated_margins("content_free", raw, base)
        return calibrated_margins(self.mode, self._raw(question, passages, similarities))

    def score(self, question: str, passages: Sequence[str], similarities: Sequence[float] | None = None) -> list[float]:
        """Calibrated scores in [0, 1]."""
        if self.mode == "none":
            return self.inner.score(question, passages, similarities) if self.wants_similarities \
                else self.inner.score(question, passages)
        return [sigmoid(m) for m in self.margins(question, passages, similarities)]


def calibrate(verifier: Any, mode: str) -> Any:
    """``verifier`` with ``mode`` calibration (``none`` keeps its own scores; embedding verifiers are wrapped too, so
    MeVe knows to pass them the cosines)."""
    if mode == "none" and not getattr(verifier, "wants_similarities", False):
        return verifier
    return CalibratedVerifier(verifier, mode)


def build_meve_verifier(kind: str, name: str, calibration: str = "none", device: str = "auto", batch_size: int = VERIFIER_BATCH,
                        max_passage_tokens: int = 128, backend: str = "transformers", dtype: str = "auto") -> Any:
    """MeVe's phase-2 verifier from its settings: ``kind`` (a :data:`memreader.retrieval.verifier.KINDS` kind, or
    ``embedding``) with ``calibration`` applied."""
    if kind == "embedding":
        return calibrate(EmbeddingVerifier(), calibration)
    return calibrate(build_verifier(kind, name, device=device, batch_size=batch_size,
                                    max_passage_tokens=max_passage_tokens, backend=backend, dtype=dtype), calibration)
