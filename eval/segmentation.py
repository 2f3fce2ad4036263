"""Scores of a predicted segmentation (a memory's chunk boundaries) against gold boundaries: boundary P/R/F1
within a tolerance, Pk, WindowDiff and outline agreement.

    from memreader.eval.segmentation import SegmentationSettings, score_document, aggregate
    doc = score_document(memory, gold_boundaries, gold_titles, SegmentationSettings(tolerance=3))
    result = aggregate([doc, ...], SegmentationSettings())   # .f1, .pk, .window_diff, .signature

Details (definitions, the window k, why written by hand): docs/EVALUATION.md (Segmentation against gold boundaries).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from memreader.core.boundaries import match_boundaries, prf
from memreader.core.config import validate as validate_config
from memreader.core.schema import DocumentMemory
from memreader.eval.tokenize import postprocess, tokenize, tokenizer_signature

SEGMENTATION_VERSION = "1.0"
"""Bump when any definition here changes; it is part of every signature."""
OUTLINE_TOKENIZER = "jieba"  # the project's answer-metric tokenizer (eval/metrics.py): Chinese words, English words


@dataclass(frozen=True)
class SegmentationSettings:
    """Every setting that can change a segmentation score."""

    tolerance: int = 3
    """Characters a predicted boundary may be from a gold one and still match it."""
    window: int = 0
    """Pk / WindowDiff window ``k`` in characters; 0 = half the mean gold segment length of each document."""

    def problems(self) -> list[str]:
        """Every invalid value, naming it and the valid range."""
        out = []
        for name in ("tolerance", "window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                out.append(f"{name}={value!r} must be an integer >= 0")
        return out

    def signature(self) -> dict[str, str]:
        """A sacrebleu-style signature per score: the settings and versions behind each number."""
        window = f"k:{self.window}" if self.window else "k:half-mean-gold-segment(round-half-up,min-1)"
        tail = f"units:char|mr-seg:{SEGMENTATION_VERSION}"
        return {
            "boundary": f"Boundary-P/R/F1|tol:{self.tolerance}|match:one-to-one-max|empty:both-1|{tail}",
            "pk": f"Pk|{window}|probes:n-k|{tail}",
            "window_diff": f"WindowDiff|{window}|probes:n-k|{tail}",
            "outline": f"Outline-ROUGE-L|score:F|pair:max-overlap|tok:{tokenizer_signature(OUTLINE_TOKENIZER)}"
            f"|ws:drop|case:lc|rouge-score:{importlib.metadata.version('rouge-score')}|{tail}",
        }


def memory_boundaries(memory: DocumentMemory) -> list[int]:
    """The offsets where the memory's chunks start, except 0."""
    return [s.start for s in memory.scenarios if s.start > 0]


def _check(boundaries: Sequence[int], length: int, what: str) -> None:
    bad = [b for b in boundaries if not 0 < b < length]
    if bad:
        raise ValueError(f"{what} boundary {bad[0]} is outside (0, {length}) for a text of {length} characters")
    if any(a >= b for a, b in zip(boundaries, boundaries[1:], strict=False)):
        raise ValueError(f"{what} boundaries must be strictly increasing, got {list(boundaries)[:20]}")


def default_window(gold: Sequence[int], length: int) -> int:
    """Half the mean gold segment length, rounded half up (not to even: 2.5 -> 3), at least 1."""
    return max(1, int(length / (len(gold) + 1) / 2 + 0.5))


def _window(gold: Sequence[int], length: int, k: int | None) -> int:
    k = k or default_window(gold, length)
    if k < 1:
        raise ValueError(f"window k={k} must be >= 1")
    return min(k, length - 1)  # a fixed k longer than a short document still leaves one probe


def _counts(boundaries: Sequence[int], length: int, k: int) -> np.ndarray:
    """Boundaries in ``(i, i + k]`` for every probe ``i`` in ``[0, length - k)``, from prefix sums."""
    marks = np.zeros(length, dtype=np.int64)
    marks[list(boundaries)] = 1
    below = np.cumsum(marks)  # below[j] = boundaries <= j = segment index of position j
    return below[k:] - below[: length - k]


def _probes(predicted: Sequence[int], gold: Sequence[int], length: int, k: int | None) -> tuple[np.ndarray, ...]:
    """Gold and predicted :func:`_counts` of every probe (none when ``length < 2``: no probe fits, no boundary)."""
    _check(gold, length, "gold")
    _check(predicted, length, "predicted")
    if length < 2:
        return np.zeros(1), np.zeros(1)
    k = _window(gold, length, k)
    return _counts(gold, length, k), _counts(predicted, length, k)


def pk(predicted: Sequence[int], gold: Sequence[int], length: int, k: int | None = None) -> float:
    """Pk of ``predicted`` against ``gold`` boundaries of a ``length``-character text (0 = perfect)."""
    g, p = _probes(predicted, gold, length, k)
    return float(np.mean((g > 0) != (p > 0)))


def window_diff(predicted: Sequence[int], gold: Sequence[int], length: int, k: int | None = None) -> float:
    """WindowDiff of ``predicted`` against ``gold`` boundaries of a ``length``-character text (0 = perfect)."""
    g, p = _probes(predicted, gold, length, k)
    return float(np.mean(g != p))


def _title_tokens(text: str) -> list[str]:
    return postprocess(tokenize(text, OUTLINE_TOKENIZER), keep_whitespace=False, lowercase=True)


def outline_agreement(memory: DocumentMemory, gold: Sequence[int], titles: Sequence[str] | None) -> float | None:
    """Mean ROUGE-L F of each gold title against the outline item of the scenario overlapping its
    segment most; None without titles, without any outline text, or when every title is blank."""
    from memreader.eval.metrics import rouge_l

    if titles is None or not any(s.outline.strip() for s in memory.scenarios):
        return None
    if len(titles) != len(gold) + 1:
        raise ValueError(f"{len(titles)} titles for {len(gold) + 1} gold segments; give one title per segment")
    cuts = [0, *gold, len(memory.document)]
    scores, j = [], 0
    for (a, b), title in zip(zip(cuts, cuts[1:], strict=False), titles, strict=True):
        while j < len(memory.scenarios) and memory.scenarios[j].end <= a:
            j += 1
        best, best_overlap = j, -1
        for i in range(j, len(memory.scenarios)):  # scenarios are sorted: stop past the segment
            s = memory.scenarios[i]
            if s.start >= b:
                break
            overlap = min(b, s.end) - max(a, s.start)
            if overlap > best_overlap:
                best, best_overlap = i, overlap
        if title.strip():
            scores.append(rouge_l(_title_tokens(memory.scenarios[best].outline), _title_tokens(title)))
    return sum(scores) / len(scores) if scores else None


@dataclass
class DocumentScores:
    """Every segmentation score of one document."""

    doc_id: str
    chars: int
    gold_boundaries: int
    predicted_boundaries: int
    matched: int
    precision: float
    recall: float
    f1: float
    pk: float
    window_diff: float
    window: int  # the k used for this document
    chunks: int
    mean_chunk_chars: float
    outline_rouge_l: float | None


def score_document(memory: DocumentMemory, gold: Sequence[int], titles: Sequence[str] | None = None,
                   settings: SegmentationSettings | None = None) -> DocumentScores:
    """Scores of ``memory``'s chunk boundaries against ``gold`` boundaries of the same text."""
    settings = settings or SegmentationSettings()
    validate_config(settings)
    n, predicted, gold = len(memory.document), memory_boundaries(memory), list(gold)
    _check(gold, n, f"{memory.doc_id!r}: gold")
    matched = len(match_boundaries(predicted, gold, settings.tolerance))
    precision, recall, f1 = prf(matched, len(predicted), len(gold))
    k = settings.window or None
    return DocumentScores(
        memory.doc_id, n, len(gold), len(predicted), matched, precision, recall, f1,
        pk(predicted, gold, n, k), window_diff(predicted, gold, n, k), _window(gold, n, k) if n > 1 else 0,
        len(memory.scenarios), n / len(memory.scenarios), outline_agreement(memory, gold, titles))


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


@dataclass
class SegmentationScores:
    """One method's scores over a gold set: macro means over documents, pooled (micro) boundary
    counts, and the per-document records; ``signature`` holds the settings behind the numbers."""

    n_docs: int
    precision: float
    recall: float
    f1: float
    micro: dict[str, float]
    pk: float
    window_diff: float
    chunks_per_doc: float
    mean_chunk_chars: float  # pooled: every chunk's characters over every chunk
    outline_rouge_l: float | None  # mean over the documents that have one
    outline_docs: int
    signature: dict[str, str]
    settings: dict[str, int]
    missing: list[str] = field(default_factory=list)  # gold documents without a memory (allowed)
    documents: list[DocumentScores] = field(default_factory=list)

    def to_dict(self, documents: bool = True) -> dict[str, Any]:
        """Plain-JSON form (without the per-document records when ``documents`` is false)."""
        data = asdict(self)
        if not documents:
            data.pop("documents")
        return data


def aggregate(docs: Sequence[DocumentScores], settings: SegmentationSettings,
              missing: Sequence[str] = ()) -> SegmentationScores:
    """The set's scores from per-document ones (all made with ``settings``)."""
    if not docs:
        raise ValueError("no document was scored; a segmentation score needs at least one document")
    matched, n_pred, n_gold = (sum(getattr(d, f) for d in docs) for f in ("matched", "predicted_boundaries",
                                                                         "gold_boundaries"))
    mp, mr, mf = prf(matched, n_pred, n_gold)
    outlines = [d.outline_rouge_l for d in docs if d.outline_rouge_l is not None]
    chunks = sum(d.chunks for d in docs)
    return SegmentationScores(
        len(docs), _mean([d.precision for d in docs]), _mean([d.recall for d in docs]), _mean([d.f1 for d in docs]),
        {"matched": matched, "predicted": n_pred, "gold": n_gold, "precision": mp, "recall": mr, "f1": mf},
        _mean([d.pk for d in docs]), _mean([d.window_diff for d in docs]), chunks / len(docs),
        sum(d.chars for d in docs) / chunks, _mean(outlines) if outlines else None, len(outlines),
        settings.signature(), {"tolerance": settings.tolerance, "window": settings.window}, list(missing), list(docs))


COLUMNS = (("precision", "P"), ("recall", "R"), ("f1", "F1"), ("micro_f1", "F1 micro"), ("pk", "Pk"),
           ("window_diff", "WinDiff"), ("chunks_per_doc", "chunks/doc"), ("mean_chunk_chars", "chars/chunk"),
           ("outline_rouge_l", "outline R-L"))
"""Table columns: attribute (micro_f1 = micro["f1"]) and heading. Pk and WindowDiff: lower is better."""


def _value(scores: SegmentationScores, key: str) -> float | None:
    return scores.micro["f1"] if key == "micro_f1" else getattr(scores, key)


def ratios(results: dict[str, SegmentationScores]) -> dict[str, dict[str, float | None]]:
    """Every method's value of each table column divided by the first method's (None where either is
    None or the first is 0)."""
    base = next(iter(results.values()))
    return {name: {key: None if (v := _value(s, key)) is None or not (b := _value(base, key)) else v / b
                   for key, _ in COLUMNS} for name, s in results.items()}


def format_table(results: dict[str, SegmentationScores]) -> str:
    """Methods side by side, then each method's ratio to the first one, then the signatures."""
    names = list(results)
    width = max(len(n) for n in [*names, "method"]) + 2
    head = "method".ljust(width) + "".join(h.rjust(12) for _, h in COLUMNS) + "docs".rjust(7)
    lines = [head]
    for name, s in results.items():
        cells = [_value(s, k) for k, _ in COLUMNS]
        lines.append(name.ljust(width) + "".join(("-" if v is None else f"{v:.4f}" if k not in (
            "chunks_per_doc", "mean_chunk_chars") else f"{v:.1f}").rjust(12) for (k, _), v in zip(
            COLUMNS, cells, strict=True)) + str(s.n_docs).rjust(7) + (f"  missing {len(s.missing)}" * bool(s.missing)))
    if len(names) > 1:
        lines += ["", f"ratio to {names[0]} (Pk, WindowDiff: lower is better)", head]
        for name, row in ratios(results).items():
            cells = ["-" if v is None else f"{v:.3f}" for v in row.values()]
            lines.append(name.ljust(width) + "".join(c.rjust(12) for c in cells) + str(results[name].n_docs).rjust(7))
    signature = next(iter(results.values())).signature
    lines += ["", *(f"{k}: {v}" for k, v in signature.items())]
    return "\n".join(lines)
