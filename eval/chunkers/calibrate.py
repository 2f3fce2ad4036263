"""Equal-length calibration: search a method's size parameter until its mean chunk length is on target.

    result = search(SizeParam("chunk_size", lo=1, hi=5000, start=250), measure, "sentence", settings, trials)

``measure(value)`` chunks the calibration documents with the parameter at ``value`` and returns the memories. The
mean chunk length is taken as monotone in the parameter (increasing, or decreasing where
:attr:`SizeParam.increasing` is False), which holds for every size parameter here up to noise.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memreader.core.schema import DocumentMemory
from memreader.eval.chunkers.base import ChunkerError, chunk_stats, within

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SizeParam:
    """A method's size parameter: its name, range, first value and how the mean follows it."""

    name: str
    lo: float
    hi: float
    start: float
    increasing: bool = True  # the mean chunk length grows with the value
    integer: bool = True
    scale: bool = True  # proportional steps make sense (mean roughly proportional to the value)

    def clamp(self, x: float) -> float:
        x = min(max(x, self.lo), self.hi)
        return float(round(x)) if self.integer else x


@dataclass
class SearchResult:
    """The value chosen, what it gave, and every trial."""

    value: float
    memories: list[DocumentMemory]
    mean: float
    tried: list[tuple[float, float]]


def _fmt(x: float, integer: bool) -> str:
    return str(int(x)) if integer else f"{x:.4g}"


def search(param: SizeParam, measure: Callable[[float], list[DocumentMemory]], method: str, target: float,
           tolerance: float, max_trials: int, progress: bool = False) -> SearchResult:
    """A value of ``param`` whose mean chunk length is within ±tolerance of ``target`` (:func:`_next_value` picks each
    trial); :class:`ChunkerError` naming the closest mean reached, and its value, when none is."""
    tried: dict[float, tuple[float, list[DocumentMemory]]] = {}

    def run(x: float) -> float:
        mems = measure(x)
        mean = chunk_stats(mems).mean
        tried[x] = (mean, mems)
        if progress:
            print(f"calibrate {method}: {param.name}={_fmt(x, param.integer)} → mean {mean:.1f} chars "
                  f"(target {target:g} ±{tolerance:.0%})")
        return mean

    def result(x: float) -> SearchResult:
        return SearchResult(x, tried[x][1], tried[x][0], [(v, m) for v, (m, _) in tried.items()])

    x = param.clamp(param.start)
    for _ in range(max_trials):
        mean = run(x)
        if within(mean, target, tolerance):
            return result(x)
        nxt = _next_value(param, tried, target)
        if nxt is None:
            raise _unreachable(param, tried, method, target, tolerance, out_of_trials=False)
        x = nxt
    raise _unreachable(param, tried, method, target, tolerance, out_of_trials=True)


def _next_value(param: SizeParam, tried: dict[float, tuple[float, Any]], target: float) -> float | None:
    """The next value to measure, or None when nothing untried can help: without a bracket, a step towards the
    target (proportional for a scale parameter, else half-way to the bound, stopping at the bound); with one, the
    secant between the tightest pair (the midpoint when it lands outside or at the ends; integers: the nearest
    untried one inside)."""
    below = [(x, m) for x, (m, _) in tried.items() if m < target]  # chunks too short
    above = [(x, m) for x, (m, _) in tried.items() if m > target]  # chunks too long
    if below and above:
        (xa, ma), (xb, mb) = max(below, key=lambda p: p[1]), min(above, key=lambda p: p[1])
        guess = xa + (target - ma) * (xb - xa) / (mb - ma) if mb != ma else (xa + xb) / 2
        lo, hi = min(xa, xb), max(xa, xb)
        if param.integer:
            inside = [v for v in range(int(lo) + 1, int(hi)) if float(v) not in tried]
            return float(min(inside, key=lambda v: abs(v - guess))) if inside else None
        if hi - lo <= 1e-4 * max(1.0, abs(hi)):
            return None
        margin = (hi - lo) * 0.05
        return guess if lo + margin < guess < hi - margin else (lo + hi) / 2
    # One side only: step towards the target.
    last_x = list(tried)[-1]
    mean = tried[last_x][0]
    up = (mean < target) == param.increasing  # move the value up?
    if param.scale and mean > 0 and last_x > 0:
        ratio = target / mean
        guess = last_x * (ratio if param.increasing else 1 / ratio)
        guess = max(guess, last_x + 1) if up and param.integer else guess
        guess = min(guess, last_x - 1) if not up and param.integer else guess
    else:
        bound = param.hi if up else param.lo
        guess = (last_x + bound) / 2
        if abs(guess - bound) < 1e-3 * max(1.0, abs(bound)):
            guess = bound
    x = param.clamp(guess)
    if x in tried:
        bound = param.clamp(param.hi if up else param.lo)
        return None if bound in tried else bound
    return x


def _unreachable(param: SizeParam, tried: dict[float, tuple[float, Any]], method: str, target: float,
                 tolerance: float, out_of_trials: bool) -> ChunkerError:
    best_x = min(tried, key=lambda x: abs(tried[x][0] - target))
    best = tried[best_x][0]
    means = sorted(m for m, _ in tried.values())
    if out_of_trials:
        flat = means[-1] - means[0] <= 0.01 * target
        why = f"stopped after {len(tried)} values (the trial limit)" + (
            f"; the mean hardly changes with {param.name}" if flat else "")
        fix = (f"{method}'s chunk length does not follow {param.name} here (e.g. a model that cuts at the same "
               f"places whatever the window): leave {method} out or use another model" if flat else
               f"raise the trial limit (max_trials / model_max_trials), use a target_chars between {means[0]:.0f} "
               f"and {means[-1]:.0f}, or raise tolerance")
    else:
        why = (f"{len(tried)} values tried, means {means[0]:.1f}–{means[-1]:.1f}: " +
               (f"chunks get no {'longer' if best < target else 'shorter'} within {param.name} "
                f"[{_fmt(param.lo, param.integer)}, {_fmt(param.hi, param.integer)}]"
                if not (means[0] < target < means[-1]) else "the mean jumps over the target between neighbouring values"))
        reach = (f"between {means[0]:.0f} and {means[-1]:.0f}" if means[0] < target < means[-1] else
                 f"of at most about {means[-1]:.0f}" if best < target else f"of at least about {means[0]:.0f}")
        fix = f"use a target_chars {reach} for {method}, raise tolerance, or leave {method} out of the comparison"
    return ChunkerError(
        f"{method}: no {param.name} gives a mean chunk length within ±{tolerance:.0%} of {target:g} characters; "
        f"closest: {best:.1f} at {param.name}={_fmt(best_x, param.integer)} ({why})", fix)
