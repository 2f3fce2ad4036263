"""``memreader.eval`` (the ``eval/`` folder): the evaluation of MemReader against chunking baselines
(``memreader eval``, ``report``, ``score``, the chunking methods, intrinsic quality, metrics and statistics).
Its modules: the ``eval/`` row of docs/ARCHITECTURE.md; the evaluation itself: docs/EVALUATION.md.
"""
