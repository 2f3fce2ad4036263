"""Intrinsic chunk quality: measured on the chunks themselves, no question involved, and how it goes with the QA
metrics across methods.

- :mod:`~memreader.eval.intrinsic.measures`: per memory, the evaluator's atomic-chunk **clarity**, the MoC paper's
  **boundary clarity** (from the same forward passes) and **chunk stickiness** (from the index embedder);
  the ``clarity`` and ``stickiness`` entries of an eval summary.
- :mod:`~memreader.eval.intrinsic.correlation`: the one correlation table (each intrinsic metric against BLEU-1,
  ROUGE-L and METEOR across methods; one filter; Pearson and Spearman with paired bootstrap intervals).
- :mod:`~memreader.eval.intrinsic.section`: the report's clarity and intrinsic-quality sections and plots.

    from memreader.eval.intrinsic import boundary_clarity, chunk_clarity, correlation_table, stickiness_record
"""

from memreader.eval.intrinsic.correlation import (
    INTRINSIC,
    QA,
    Correlation,
    CorrelationError,
    CorrelationRow,
    MethodRow,
    correlate,
    correlation_row,
    correlation_table,
    method_rows,
)
from memreader.eval.intrinsic.measures import (
    CLARITY_REPORT_VERSION,
    INTRINSIC_VERSION,
    IntrinsicError,
    boundary_clarity,
    chunk_clarity,
    chunk_scores,
    chunk_stickiness,
    clarity_signature,
    clarity_summary,
    null_threshold,
    stickiness_record,
    stickiness_signature,
    structural_entropy,
)

__all__ = [
    "CLARITY_REPORT_VERSION", "INTRINSIC", "INTRINSIC_VERSION", "QA", "Correlation", "CorrelationError",
    "CorrelationRow", "IntrinsicError", "MethodRow", "boundary_clarity", "chunk_clarity", "chunk_scores",
    "chunk_stickiness", "clarity_signature", "clarity_summary", "correlate", "correlation_row", "correlation_table",
    "method_rows", "null_threshold", "stickiness_record", "stickiness_signature", "structural_entropy",
]
