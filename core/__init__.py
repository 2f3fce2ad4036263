"""MemReader core: the services every stage shares (schema, prompts, parser, aligner, memory grammar, generation
and scoring engines, model registry, windowing, I/O). Installed as ``memreader.core``; it imports nothing of the
stages or the top layer (scripts/check_layers.py).
"""
