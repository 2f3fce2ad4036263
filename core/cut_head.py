"""The cut head: a small classifier over :mod:`memreader.core.cut_features` rows, saved beside a LoRA adapter.

    scorer = CutScorer.load("results/structure-adapter/cut_head", base="smollm2-135m-instruct")
    scored = scorer.score(text)                       # every allowed end with P(a new topic starts here)
    breaks = scored.breaks(scorer.threshold, gap=150)

A folder ``cut_head/`` holds ``head.safetensors`` (weights, feature normalisation) and ``head.json`` (the fit).
Ends at or above the threshold, at least ``gap`` (:func:`min_gap`) apart, become memory grammar breaks.
Details: docs/TRAINING.md (The cut head).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memreader.core.cut_features import FEATURES_VERSION, CutFeatures, CutScorerError
from memreader.core.language import is_chinese
from memreader.core.memory_grammar import GrammarSettings

HEAD_FILE, META_FILE, FOLDER = "head.safetensors", "head.json", "cut_head"
HEAD_FORMAT = 1


def build_head(dim: int, hidden: int) -> Any:
    """The classifier: one hidden layer of ``hidden`` units (0: a linear head) to one logit."""
    from torch import nn

    if hidden <= 0:
        return nn.Sequential(nn.Linear(dim, 1))
    return nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(0.1), nn.Linear(hidden, 1))


def check_threshold(value: float, what: str = "cut_threshold") -> float:
    """``value`` when it lies strictly between 0 and 1, else a :class:`CutScorerError` naming the range."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise CutScorerError(f"{what}={value!r} is not a probability strictly between 0 and 1",
                             "give a value in (0, 1), or 0 for the threshold stored with the head")
    return float(value)


def min_gap(text: str, grammar: GrammarSettings | None = None) -> int:
    """The grammar's shortest chunk for ``text``'s language: two breaks closer than this are one topic change."""
    return (grammar or GrammarSettings()).chunk_range(is_chinese(text[:4000]))[0]


def pick_breaks(ends: list[int], p: np.ndarray, threshold: float, gap: int) -> list[int]:
    """Ends with ``p >= threshold``, strongest first, each at least ``gap`` characters from every one kept."""
    kept: list[int] = []
    for i in np.argsort(-np.asarray(p), kind="stable"):
        if p[i] < threshold:
            break
        if all(abs(ends[i] - k) >= gap for k in kept):
            kept.append(ends[i])
    return sorted(kept)


@dataclass
class Scored:
    """One text's allowed ends and the probability of a topic change at each."""

    ends: list[int]
    p: np.ndarray

    def breaks(self, threshold: float, gap: int) -> list[int]:
        return pick_breaks(self.ends, self.p, threshold, gap)

    def record(self, threshold: float, breaks: list[int], head: str) -> dict[str, Any]:
        """What a memory keeps of the scores it was read with (``meta.cuts``)."""
        return {"head": head, "threshold": round(threshold, 4), "breaks": breaks,
                "ends": self.ends, "p": [round(float(v), 3) for v in self.p]}


@dataclass
class CutHead:
    """Weights, feature normalisation and the fit's record."""

    net: Any
    mean: np.ndarray
    std: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def threshold(self) -> float:
        return float(self.meta["threshold"])

    def probabilities(self, rows: np.ndarray) -> np.ndarray:
        import torch

        if len(rows) == 0:
            return np.zeros(0, dtype=np.float32)
        x = torch.from_numpy(((rows - self.mean) / self.std).astype(np.float32))
        self.net.eval()
        with torch.inference_mode():
            return torch.sigmoid(self.net(x)[:, 0]).numpy()

    def save(self, folder: str | Path) -> Path:
        """Write ``head.safetensors`` + ``head.json`` into ``folder`` (created)."""
        import torch
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {f"net.{k}": v.detach().contiguous() for k, v in self.net.state_dict().items()}
        tensors["mean"], tensors["std"] = torch.from_numpy(self.mean.copy()), torch.from_numpy(self.std.copy())
        save_file(tensors, str(folder / HEAD_FILE))
        (folder / META_FILE).write_text(json.dumps(self.meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> CutHead:
        from safetensors.torch import load_file

        folder = Path(folder)
        if not (folder / HEAD_FILE).is_file() or not (folder / META_FILE).is_file():
            raise CutScorerError(f"{folder} is not a cut head folder (no {HEAD_FILE} + {META_FILE})",
                                 "fit one with `memreader train` and cut_head: true, or give cut_head=none")
        meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
        if meta.get("format") != HEAD_FORMAT or meta.get("features", {}).get("version") != FEATURES_VERSION:
            raise CutScorerError(f"{folder} was written by another version of the cut head (format "
                                 f"{meta.get('format')}, features {meta.get('features', {}).get('version')}; this "
                                 f"one reads {HEAD_FORMAT} / {FEATURES_VERSION})", "fit it again with `memreader train`")
        tensors = load_file(str(folder / HEAD_FILE))
        net = build_head(int(meta["dim"]), int(meta["hidden"]))
        net.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("net.")})
        return cls(net, tensors["mean"].numpy(), tensors["std"].numpy(), meta)


@dataclass
class CutScorer:
    """A head with the features it was fitted on, loaded on the base model the reader runs."""

    head: CutHead
    features: CutFeatures
    folder: str

    @property
    def threshold(self) -> float:
        return self.head.threshold

    @classmethod
    def load(cls, folder: str | Path, base: str, threads: int = 0, dtype: str = "float32") -> CutScorer:
        """The head in ``folder`` on ``base``'s layers, its prefill in ``dtype`` (:func:`cut_dtype`: ``auto``, or
        ``float32`` as the head was fitted); refused when it was fitted on another base model."""
        from memreader.core.registry import canonical_name

        head = CutHead.load(folder)
        fit_on = head.meta["base_model"]
        feats = head.meta["features"]
        features = CutFeatures.load(base, int(feats["layers"]), int(feats["window"]), int(feats["max_tokens"]),
                                    threads, drop=bool(feats.get("drop", False)), dtype=dtype)
        if features.signature != fit_on["signature"]:
            raise CutScorerError(
                f"the cut head in {folder} was fitted on {fit_on['name']} ({fit_on['signature']}), not on the "
                f"reader's model {canonical_name(base)} ({features.signature})",
                f"read with model={fit_on['name']}, or fit a head for {canonical_name(base)}")
        return cls(head, features, str(folder))

    def score(self, text: str) -> Scored:
        ends, rows = self.features.of(text)
        return Scored(ends, self.head.probabilities(rows))


def resolve_head_folder(setting: str, adapter: str) -> tuple[Path | None, str]:
    """(the head folder to read with, or None; a note for the run's output) for ``cut_head`` = ``auto`` (the
    adapter's ``cut_head/`` when it has one), ``none`` / empty (off) or a folder (must hold a head)."""
    if setting in ("", "none"):
        return None, "cut head: off (cut_head=none): cuts are the model's alone"
    if setting == "auto":
        if not adapter:
            return None, "cut head: none (no adapter): cuts are the model's alone"
        folder = Path(adapter) / FOLDER
        if not (folder / META_FILE).is_file():
            return None, (f"cut head: adapter {adapter} has no {FOLDER}/: cuts are the model's alone (fit one with "
                          "`memreader train` and cut_head: true)")
        return folder, f"cut head: {folder}"
    folder = Path(setting)
    if not (folder / META_FILE).is_file():
        raise CutScorerError(f"cut_head={setting}: no cut head there (no {META_FILE})",
                             "give a folder written by `memreader train` with cut_head: true, auto, or none")
    return folder, f"cut head: {folder}"


def head_sha256(folder: str | Path) -> str:
    """The head's identity for a read key: the hash of its weights and record."""
    import hashlib

    h = hashlib.sha256()
    for name in (HEAD_FILE, META_FILE):
        h.update((Path(folder) / name).read_bytes())
    return h.hexdigest()[:16]


@dataclass
class Cutter:
    """What a reading run asks for each document: the breaks the head puts in its grammar, and their record."""

    scorer: CutScorer
    threshold: float
    min_gap: Any  # text -> the grammar's shortest chunk for its language
    seconds: float = 0.0
    documents: int = 0

    def describe(self) -> dict[str, Any]:
        """What a run's summary keeps: the head, its threshold, and the seconds spent scoring."""
        return {"head": Path(self.scorer.folder).as_posix(), "threshold": self.threshold,
                "dtype": self.scorer.features.dtype, "documents": self.documents, "seconds": round(self.seconds, 2)}

    def __call__(self, text: str) -> tuple[list[int], dict[str, Any]]:
        import time

        t0 = time.perf_counter()
        scored = self.scorer.score(text)
        breaks = scored.breaks(self.threshold, self.min_gap(text))
        self.seconds += time.perf_counter() - t0
        self.documents += 1
        return breaks, scored.record(self.threshold, breaks, Path(self.scorer.folder).as_posix())
