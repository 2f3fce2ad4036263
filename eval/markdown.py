"""Markdown helpers of the reports (``memreader report``, the paper's tables, the intrinsic-quality section):
numbers, intervals and tables as lines of Markdown.

    from memreader.eval.markdown import fmt, table, value_ci
    lines = table(["method", "ROUGE-L"], [["fixed", value_ci(0.31, 0.28, 0.35)]])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def fmt(x: Any, digits: int = 4) -> str:
    """A number with ``digits`` decimals, ``n/a`` for None or NaN."""
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def interval(low: Any, high: Any, digits: int = 4) -> str:
    """``[low, high]`` with :func:`fmt`'s numbers."""
    return f"[{fmt(low, digits)}, {fmt(high, digits)}]"


def value_ci(value: Any, low: Any, high: Any, digits: int = 4) -> str:
    """``value [low, high]``."""
    return f"{fmt(value, digits)} {interval(low, high, digits)}"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """Lines of a Markdown table (pipes in cells escaped, line breaks made spaces), then a blank line."""
    cell = lambda v: str(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    return ["| " + " | ".join(map(cell, header)) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(map(cell, r)) + " |" for r in rows), ""]
