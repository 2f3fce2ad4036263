"""The evaluator scorer's settings: one set of keys, defaults and checks for every stage that scores memories.

    class AssessConfig(EvaluatorConfig): ...     # gen, assess and eval inherit the keys: each YAML stays flat
    scorer = evaluator_scorer(cfg)               # memreader.core.scoring: the one function that builds it

Each key is checked by its field (:func:`memreader.core.config.field`), so no stage's ``problems()`` repeats it;
:class:`ScorerSettings` adds the scorer's own knobs (truncation, slicing, padding; :mod:`memreader.core.scoring`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from memreader.core.config import field, validate
from memreader.core.engines import (
    backend_field,
    backend_problem,
    device_field,
    device_problem,
    dtype_field,
    dtype_problem,
)
from memreader.core.errors import MemReaderError
from memreader.core.registry import SMOLLM2

VARIANTS = ("prob", "margin", "ppl")
#: Evaluator tokens (padded) per forward batch: the default of ``evaluator_batch_tokens`` everywhere.
EVALUATOR_BATCH_TOKENS = 8192


class ScoringError(MemReaderError, ValueError):
    """Bad scorer settings, or an evaluator that cannot score as asked."""


def check_variants(variants: Sequence[str]) -> list[str]:
    """``variants`` as a list, or :class:`ScoringError` naming the valid ones."""
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        raise ScoringError(f"unknown clarity variant(s) {bad or list(variants)!r}",
                           f"use one or more of {', '.join(VARIANTS)}")
    return list(dict.fromkeys(variants))


def _checked(f: Any, check: Any) -> Any:
    """The shared engine field ``f`` (its default and help) with its value checked by ``check``."""
    return field(f.default, help=f.metadata["help"], check=check)


@dataclass
class EvaluatorConfig:
    """The evaluator's keys of a stage config (gen, assess, eval): inherited, never declared again."""

    evaluator: str = field(SMOLLM2, help="evaluator causal LM of clarity and completeness (registry name or folder; "
                           "paper: Qwen2.5-7B-Instruct)")
    clarity_variant: str = field(
        "ppl", help="atomic-chunk clarity: ppl (conditional perplexity; the default, measured best on small "
        "evaluators; it also gives eval's boundary clarity from the same forward passes), prob or margin (the paper's "
        "yes/no question); memreader.core.scoring",
        check=lambda v: None if v in VARIANTS else f"clarity_variant: {v!r} is not one of {', '.join(VARIANTS)}")
    evaluator_backend: str = _checked(
        backend_field("scorer", "the evaluator scorer (it shares the teacher's or answerer's weights or engine when it "
                      "names the same model, dtype and device)"),
        lambda v: backend_problem(v, "scorer", "evaluator_backend"))
    evaluator_dtype: str = _checked(dtype_field("the evaluator's weights"),
                                    lambda v: dtype_problem(v, "evaluator_dtype"))
    evaluator_device: str = _checked(device_field("the evaluator's device"),
                                     lambda v: device_problem(v, "evaluator_device"))
    evaluator_batch_tokens: int = field(EVALUATOR_BATCH_TOKENS, ge=1, help="evaluator tokens per forward batch")


@dataclass
class ScorerSettings(EvaluatorConfig):
    """The evaluator's keys and the scorer's own knobs (see :mod:`memreader.core.scoring` for the formulas)."""

    slice_tokens: int = field(256, ge=1, help="scored positions per LM-head slice (memory: slice x vocab fp32)")
    max_chunk_tokens: int = field(512, ge=1, help="a text's tokens kept (the context's last, any other's first)")
    ppl_target_tokens: int = field(32, ge=0, help="ppl clarity: the successor's first N tokens (0: the whole chunk)")
    max_pad_fraction: float = field(0.1, ge=0, lt=1, help="most padding in a batch (0.1: at most 10%)")
    max_model_len: int = field(8192, ge=16, help="evaluator_backend=vllm: the engine's context length (the same as "
                               "another stage's: one engine)")

    def __post_init__(self) -> None:
        validate(self, ScoringError, "scorer")

    @classmethod
    def of(cls, cfg: EvaluatorConfig, **more: Any) -> ScorerSettings:
        """The settings of a stage config's evaluator keys, with ``more`` of the scorer's own."""
        return cls(**{f.name: getattr(cfg, f.name) for f in fields(EvaluatorConfig)}, **more)
