"""``memreader.eval`` (the ``eval/`` folder): the evaluation of MemReader against chunking baselines.

- ``memreader eval`` (qa): RAG question answering over every chunking method at equal chunk length, one method at a
  time and resumable (method_run, suites, answering, support, costs, records; a portable copy: checkpoint); with
  ``dataset: gold_segments``, the segmentation scores instead (segmentation_run, segmentation, gold_segments);
- the chunking methods (chunkers/) and intrinsic chunk quality (intrinsic/);
- answer metrics with signatures (metrics, tokenize), bootstrap statistics (stats), dataset loaders (datasets),
  the corpora with gold supporting passages that MeVe is calibrated on (support_corpora);
- ``memreader report`` (report, report_page, plots, markdown, paper_tables) and ``memreader score`` (score_cli over
  the library score).
"""
