"""Fitting the cut head (:mod:`memreader.core.cut_head`) on documents with gold boundaries.

    summary = fit_cut_head(CutFitSettings(data="artifacts/datasets/structure/train.jsonl"), out="<run>/train/cut_head")

Every allowed end is one example (1 within ``tolerance`` characters of a gold boundary); a hash split of the documents
chooses the epoch and the threshold. Details: docs/TRAINING.md (The cut head: a learned cut inside the reader).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from memreader.core.boundaries import match_boundaries, prf
from memreader.core.cut_features import FEATURES_VERSION, CutFeatures, CutScorerError, cached_rows, labels_for
from memreader.core.cut_head import FOLDER, HEAD_FORMAT, CutHead, build_head, min_gap, pick_breaks
from memreader.core.registry import SMOLLM2

THRESHOLDS = tuple(round(t, 2) for t in np.arange(0.05, 0.96, 0.05))


@dataclass(frozen=True)
class CutFitSettings:
    """How a cut head is fitted."""

    data: str = ""
    model: str = SMOLLM2
    layers: int = 12
    window: int = 32
    max_tokens: int = 1024
    hidden: int = 256
    epochs: int = 40
    lr: float = 1e-3
    weight_decay: float = 0.01
    batch: int = 256
    tune_share: float = 0.15
    tolerance: int = 3
    seed: int = 0
    limit: int = 0
    cache_dir: str = ""
    drop: bool = False


@dataclass
class GoldDoc:
    id: str
    text: str
    boundaries: list[int]
    group: str
    kind: str = ""
    lang: str = ""


def load_gold(path: str | Path, limit: int = 0) -> list[GoldDoc]:
    """The documents of ``path``; bad lines and a file without any boundary are named with the fix."""
    path = Path(path)
    if not path.is_file():
        raise CutScorerError(f"cut-head data {path} does not exist",
                             "build it with `memreader structure-data` (or give documents with gold boundaries)")
    docs: list[GoldDoc] = []
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                text, bounds = item["text"], [int(b) for b in item["boundaries"]]
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise CutScorerError(f"{path} line {n}: not a document with gold boundaries ({exc})",
                                     'each line needs {"id", "text", "boundaries": [offsets where sections 2..K '
                                     'start]}') from None
            if any(not 0 < b < len(text) for b in bounds):
                raise CutScorerError(f"{path} line {n}: a boundary lies outside (0, {len(text)})",
                                     "boundaries are character offsets inside the text")
            docs.append(GoldDoc(str(item.get("id", n)), text, bounds, str(item.get("group") or item.get("id", n)),
                                str(item.get("kind", "")), str(item.get("lang", ""))))
            if limit and len(docs) >= limit:
                break
    if not docs or not any(d.boundaries for d in docs):
        raise CutScorerError(f"{path}: none of its {len(docs)} documents has a gold boundary, so there is no topic "
                             "change to learn", "use documents of several sections (`memreader structure-data` joins "
                             "passages and cuts manuals at their headings)")
    return docs


def split_tune(docs: list[GoldDoc], share: float) -> tuple[list[GoldDoc], list[GoldDoc]]:
    """(fit, tune): a document goes to tune when the hash of its group falls below ``share``."""
    def bucket(d: GoldDoc) -> float:
        return int(hashlib.sha256(d.group.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    tune = [d for d in docs if bucket(d) < share]
    fit = [d for d in docs if bucket(d) >= share]
    if not tune or not fit:
        raise CutScorerError(f"{len(docs)} documents cannot be split {1 - share:.0%} / {share:.0%} into fitting and "
                             "tuning parts", "give more documents (dozens at least)")
    return fit, tune


def boundary_f1(pred: list[list[int]], gold: list[list[int]], tolerance: int) -> float:
    """Micro F1 over documents, predictions matched one-to-one to gold within ``tolerance`` characters
    (:func:`memreader.core.boundaries.match_boundaries`)."""
    hit = sum(len(match_boundaries(p, g, tolerance)) for p, g in zip(pred, gold, strict=True))
    return prf(hit, sum(map(len, pred)), sum(map(len, gold)))[2]


@dataclass
class _Rows:
    docs: list[GoldDoc]
    ends: list[list[int]]
    x: list[np.ndarray]
    y: list[np.ndarray]

    def stacked(self) -> tuple[np.ndarray, np.ndarray]:
        return np.concatenate(self.x), np.concatenate(self.y)


def _rows(features: CutFeatures, docs: list[GoldDoc], cache: Path | None, tolerance: int, what: str) -> _Rows:
    out = _Rows(docs, [], [], [])
    for d in tqdm(docs, desc=f"cut features ({what})", unit="doc"):
        ends, x = cached_rows(features, d.text, cache)
        out.ends.append(ends)
        out.x.append(x)
        out.y.append(labels_for(ends, d.boundaries, tolerance))
    return out


def choose_threshold(probs: list[np.ndarray], rows: _Rows, tolerance: int) -> tuple[float, float]:
    """(threshold, boundary F1) with the best F1 on ``rows``' documents."""
    gaps = [min_gap(d.text) for d in rows.docs]
    gold = [d.boundaries for d in rows.docs]
    return max(((t, boundary_f1([pick_breaks(e, p, t, g) for e, p, g in zip(rows.ends, probs, gaps, strict=True)],
                                gold, tolerance)) for t in THRESHOLDS), key=lambda tf: tf[1])  # ties: the lowest


def fit_cut_head(settings: CutFitSettings, out: str | Path, threads: int = 0) -> dict[str, Any]:
    """Fit a head on ``settings.data``, choose its threshold, save it into ``out``; returns the summary (also in
    ``out/head.json``) with the curve of every epoch."""
    import torch

    t0 = time.perf_counter()
    docs = load_gold(settings.data, settings.limit)
    fit_docs, tune_docs = split_tune(docs, settings.tune_share)
    features = CutFeatures.load(settings.model, settings.layers, settings.window, settings.max_tokens, threads,
                                drop=settings.drop)
    cache = Path(settings.cache_dir) if settings.cache_dir else None
    fit, tune = (_rows(features, fit_docs, cache, settings.tolerance, "fit"),
                 _rows(features, tune_docs, cache, settings.tolerance, "tune"))
    t_features = time.perf_counter() - t0
    x, y = fit.stacked()
    xt, yt = tune.stacked()
    if y.sum() == 0:
        raise CutScorerError("no allowed end of the fitting documents lies at a gold boundary",
                             f"check that the boundaries are where sections start (tolerance {settings.tolerance})")
    if yt.sum() == 0:
        raise CutScorerError(f"none of the {len(tune_docs)} tuning documents has a gold boundary at an allowed end, so "
                             "no threshold can be chosen", "give more documents with several sections")
    mean, std = x.mean(0), x.std(0) + 1e-4
    torch.manual_seed(settings.seed)
    net = build_head(x.shape[1], settings.hidden)
    opt = torch.optim.AdamW(net.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    pos_weight = torch.tensor([(len(y) - y.sum()) / y.sum()], dtype=torch.float32)
    loss_fn = torch.nn.BCEWithLogitsLoss(pos_weight=pos_weight)
    xs, ys = torch.from_numpy((x - mean) / std).float(), torch.from_numpy(y)
    xts, yts = torch.from_numpy((xt - mean) / std).float(), torch.from_numpy(yt)
    g = torch.Generator().manual_seed(settings.seed)
    curves, best_state, best_loss = [], None, float("inf")
    for epoch in range(1, settings.epochs + 1):
        net.train()
        total = 0.0
        for idx in torch.randperm(len(xs), generator=g).split(settings.batch):
            opt.zero_grad()
            loss = loss_fn(net(xs[idx])[:, 0], ys[idx])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        net.eval()
        with torch.inference_mode():
            tune_loss = float(loss_fn(net(xts)[:, 0], yts))
        curves.append({"epoch": epoch, "loss": round(total / len(xs), 5), "tune_loss": round(tune_loss, 5)})
        if tune_loss < best_loss:
            best_loss, best_state = tune_loss, {k: v.clone() for k, v in net.state_dict().items()}
    if best_state is None:
        raise CutScorerError("the cut head's tuning loss was never finite (NaN features or a diverging fit)",
                             "check the features (a model in fp32), or lower the learning rate")
    net.load_state_dict(best_state)
    head = CutHead(net, mean.astype(np.float32), std.astype(np.float32))
    probs = [head.probabilities(r) for r in tune.x]
    threshold, tune_f1 = choose_threshold(probs, tune, settings.tolerance)
    best_epoch = min(curves, key=lambda c: c["tune_loss"])["epoch"]
    head.meta = {
        "format": HEAD_FORMAT, "dim": int(x.shape[1]), "hidden": settings.hidden, "threshold": threshold,
        "base_model": {"name": features.name, "signature": features.signature},
        "features": {"version": FEATURES_VERSION, "layers": settings.layers, "window": settings.window,
                     "max_tokens": settings.max_tokens, "drop": settings.drop},
        "fit": {**asdict(settings), "documents": {"fit": len(fit_docs), "tune": len(tune_docs)},
                "ends": {"fit": len(y), "fit_boundaries": int(y.sum()), "tune": len(yt),
                         "tune_boundaries": int(yt.sum())},
                "data_sha256": hashlib.sha256(Path(settings.data).read_bytes()).hexdigest(),
                "best_epoch": best_epoch, "tune_loss": round(best_loss, 5), "tune_f1": round(tune_f1, 4),
                "seconds": {"features": round(t_features, 1), "total": round(time.perf_counter() - t0, 1)}},
        "curves": curves,
    }
    head.save(out)
    print(f"cut head: {len(fit_docs)} + {len(tune_docs)} documents ({len(y)} ends, {int(y.sum())} at a boundary); "
          f"best epoch {best_epoch}, tune loss {best_loss:.4f}; threshold {threshold} → tune boundary F1 "
          f"{tune_f1:.3f}; {head.meta['fit']['seconds']['total']:.0f} s → {out}")
    return head.meta


__all__ = ["FOLDER", "CutFitSettings", "fit_cut_head", "load_gold", "boundary_f1", "split_tune"]
