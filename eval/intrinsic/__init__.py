"""Intrinsic chunk quality: measured on the chunks themselves, no question involved, and how it goes with the QA
metrics across methods.

- :mod:`~memreader.eval.intrinsic.measures`: per memory, the evaluator's atomic-chunk **clarity**, the MoC paper's
  **boundary clarity** (from the same forward passes) and **chunk stickiness** (from the index embedder);
  the ``clarity`` and ``stickiness`` entries of an eval summary.
- :mod:`~memreader.eval.intrinsic.correlation`: the one correlation table (each intrinsic metric against BLEU-1,
  ROUGE-L and METEOR across methods; one filter; Pearson and Spearman with paired bootstrap intervals).
- :mod:`~memreader.eval.intrinsic.section`: the report's clarity and intrinsic-quality sections and plots.

    from memreader.eval.intrinsic import boundary_clarity, chunk_scores, correlation_table, stickiness_record
"""

from memreader.eval.intrinsic.correlation import (
    CorrelationError,
    MethodRow,
    correlate,
    correlation_row,
    correlation_table,
)
from memreader.eval.intrinsic.measures import (
    IntrinsicError,
    boundary_clarity,
    chunk_scores,
    chunk_stickiness,
    clarity_signature,
    null_threshold,
    stickiness_record,
    stickiness_signature,
    structural_entropy,
)

__all__ = [
    "CorrelationError", "IntrinsicError", "MethodRow", "boundary_clarity", "chunk_scores", "chunk_stickiness",
    "clarity_signature", "correlate", "correlation_row", "correlation_table", "null_threshold", "stickiness_record",
    "stickiness_signature", "structural_entropy",
]
