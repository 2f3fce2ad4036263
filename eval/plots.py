"""PNG figures of ``memreader report`` (matplotlib, Agg backend, ASCII labels only).

    metric_bars(rows, path)            # one panel per metric: value per method with its 95% interval
    chunk_histograms(lengths, path)    # chunk lengths (characters) per method, target +-tolerance band
    clarity_scatter(points, path)      # mean clarity vs mean ROUGE-L per method, least-squares line, r
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

DPI = 110


def ascii_label(text: str, limit: int = 40) -> str:
    """``text`` with every non-ASCII character replaced by ``?`` (the bundled fonts lack CJK glyphs)."""
    out = re.sub(r"[^\x20-\x7e]", "?", str(text))
    return out if len(out) <= limit else out[: limit - 3] + "..."


@dataclass(frozen=True)
class Bar:
    """One bar: a method's value of a metric with its interval (None: not measured)."""

    method: str
    value: float | None
    low: float | None = None
    high: float | None = None


def metric_bars(panels: Mapping[str, Sequence[Bar]], path: Path, title: str = "") -> Path:
    """One subplot per metric (``panels``: metric label -> bars), error bars at the intervals."""
    n = len(panels)
    if n == 0:
        raise ValueError("metric_bars needs at least one metric")
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax, (label, bars) in zip(axes.flat, panels.items(), strict=False):
        names = [ascii_label(b.method, 18) for b in bars]
        values = [b.value if b.value is not None else 0.0 for b in bars]
        err = np.array([[max(0.0, b.value - b.low) if b.value is not None and b.low is not None else 0.0 for b in bars],
                        [max(0.0, b.high - b.value) if b.value is not None and b.high is not None else 0.0
                         for b in bars]])
        x = np.arange(len(bars))
        ax.bar(x, values, yerr=err, capsize=4, color=[f"C{i % 10}" for i in range(len(bars))])
        for i, b in enumerate(bars):
            if b.value is None:
                ax.text(i, 0, "n/a", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
        ax.set_title(ascii_label(label), fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    if title:
        fig.suptitle(ascii_label(title, 100), fontsize=11)
    fig.tight_layout()
    return _save(fig, path)


def chunk_histograms(lengths: Mapping[str, Sequence[int]], path: Path,
                     bands: Mapping[str, tuple[float, float, float] | None] | None = None) -> Path:
    """Histogram of chunk lengths (characters) per method; ``bands[method] = (target, low, high)`` shades
    ``[low, high]`` and marks the target."""
    if not lengths:
        raise ValueError("chunk_histograms needs at least one method")
    bands = bands or {}
    n = len(lengths)
    fig, axes = plt.subplots(n, 1, figsize=(7.0, 2.2 * n), squeeze=False)
    top = max((max(v) for v in lengths.values() if len(v)), default=1)
    bins = np.linspace(0, top + 1, 41)
    for ax, (method, values) in zip(axes[:, 0], lengths.items(), strict=True):
        ax.hist(values, bins=bins, color="C0", alpha=0.8)
        band = bands.get(method)
        if band is not None:
            target, low, high = band
            ax.axvspan(low, high, color="C2", alpha=0.2, label=f"target {target:.0f} [{low:.0f}, {high:.0f}]")
            ax.axvline(target, color="C2", linewidth=1.5)
            ax.legend(fontsize=8, loc="upper right")
        mean = float(np.mean(values)) if len(values) else float("nan")
        ax.set_title(f"{ascii_label(method)}: {len(values)} chunks, mean {mean:.0f} chars", fontsize=9)
        ax.set_ylabel("chunks", fontsize=8)
    axes[-1, 0].set_xlabel("chunk length (characters)")
    fig.tight_layout()
    return _save(fig, path)


def _points_with_fit(ax: plt.Axes, points: Mapping[str, tuple[float, float]], label_fit: bool = False) -> bool:
    """One labelled point per method and, with 2+ distinct x, a dashed least-squares line (whether it drew one)."""
    xs = np.array([p[0] for p in points.values()])
    ys = np.array([p[1] for p in points.values()])
    for i, (method, (x, y)) in enumerate(points.items()):
        ax.scatter([x], [y], color=f"C{i % 10}", zorder=3)
        ax.annotate(ascii_label(method, 20), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    if len(points) < 2 or np.ptp(xs) <= 0:
        return False
    slope, intercept = np.polyfit(xs, ys, 1)
    grid = np.linspace(xs.min(), xs.max(), 50)
    ax.plot(grid, slope * grid + intercept, color="grey", linestyle="--",
            label=f"fit y = {slope:.3f}x + {intercept:.3f}" if label_fit else None)
    return True


def clarity_scatter(points: Mapping[str, tuple[float, float]], path: Path, pearson: float | None = None,
                    spearman: float | None = None) -> Path:
    """Mean clarity (x) against mean ROUGE-L (y), one labelled point per method, least-squares line."""
    if not points:
        raise ValueError("clarity_scatter needs at least one method")
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    if _points_with_fit(ax, points, label_fit=True):
        ax.legend(fontsize=8, loc="lower right")
    stats = [f"{name} = {v:.3f}" for name, v in (("Pearson r", pearson), ("Spearman rho", spearman))
             if v is not None and not math.isnan(v)]
    ax.set_title("; ".join(stats) or "clarity vs ROUGE-L", fontsize=10)
    ax.set_xlabel("mean atomic-chunk clarity")
    ax.set_ylabel("mean ROUGE-L")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def intrinsic_scatter(panels: Mapping[str, Mapping[str, tuple[float, float]]], path: Path) -> Path:
    """One panel per intrinsic metric: its method mean (x) against mean ROUGE-L (y), one labelled point per
    method, with a least-squares line."""
    if not panels:
        raise ValueError("intrinsic_scatter needs at least one panel")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.0), squeeze=False)
    for ax, (title, points) in zip(axes[0], panels.items(), strict=True):
        _points_with_fit(ax, points)
        ax.set_xlabel(ascii_label(title, 40))
        ax.set_ylabel("mean ROUGE-L")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def _save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png")
    plt.close(fig)
    return path
