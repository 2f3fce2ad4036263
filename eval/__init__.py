"""Evaluation: answer metrics with signatures (``eval.metrics``), bootstrap statistics (``eval.stats``),
dataset loaders (``eval.datasets``), the scoring report and ``memreader score`` (``eval.score``)."""
