"""Chunking methods as one family: every method gives memories whose spans tile each document.

    from memreader.eval.chunkers import METHODS, ChunkerSettings, method_memories
    memories, calibration = method_memories("semantic", documents, ChunkerSettings(target_chars=178), work_dir)

Each method's size parameter is calibrated to the target mean chunk length (:class:`Calibration`). The methods
(:data:`METHODS`) and how each is calibrated: docs/CHUNKERS.md (Methods, Equal-length calibration).
"""

from memreader.eval.chunkers.base import (
    METHODS,
    Calibration,
    ChunkerError,
    ChunkerSettings,
    chunk_stats,
    chunks_as_memory,
    fixed_length_spans,
)
from memreader.eval.chunkers.methods import MODEL_METHODS, method_memories

__all__ = ["METHODS", "MODEL_METHODS", "Calibration", "ChunkerError", "ChunkerSettings", "chunk_stats",
           "chunks_as_memory", "fixed_length_spans", "method_memories"]
