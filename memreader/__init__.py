"""``memreader`` (the ``memreader/`` folder): the top layer, what a user calls.

The ``memreader`` command (cli), the Python API (api), ``memreader demo`` (demo, with demo_data/), the memories
viewer (viewer/) and the LangChain / LlamaIndex retrievers (integrations/). The stages and the core are its
subpackages, installed from their own folders (pyproject.toml): ``memreader.core`` is ``core/``, and so on
(docs/ARCHITECTURE.md).
"""

__version__ = "0.1.0"
