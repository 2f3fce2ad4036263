"""MemReader core: document-memory schema, prompts, output parser, span aligner, model registry, CLI."""

__version__ = "0.1.0"
