"""Chunking methods as one family: every method gives memories whose spans tile each document.

    from memreader.eval.chunkers import METHODS, ChunkerSettings, method_memories
    memories, calibration = method_memories("semantic", documents, ChunkerSettings(target_chars=178), work_dir)

Methods (:data:`METHODS`): ``fixed``, ``sentence`` (chonkie SentenceChunker), ``semantic``
(chonkie SemanticChunker over our offline embedders), ``lumber`` (LumberChunker, guided local LM),
``llm-direct`` (the base instruct model with the MemReader prompt, guided), ``memreader`` (the same
with its LoRA adapter) and ``teacher`` (memories from ``memreader gen``). Each method's size
parameter is calibrated so that its mean chunk length is within ±tolerance of the target
(:class:`Calibration`); see ``docs/CHUNKERS.md``.
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
