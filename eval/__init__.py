"""Evaluation: answer metrics with signatures (``memreader.eval.metrics``), bootstrap statistics (``memreader.eval.stats``),
dataset loaders (``memreader.eval.datasets``), the scoring report and ``memreader score`` (``memreader.eval.score``)."""
