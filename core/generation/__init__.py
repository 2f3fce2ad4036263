"""One generation layer for every stage: decoding settings, replies, and the chat backends.

- :class:`LocalChat` — transformers in process (CPU or GPU), batched, guided by llguidance;
- :class:`OpenAIChat` — any OpenAI-compatible server; grammars go to servers that take them;
- :class:`VLLMChat` — vLLM offline on GPU (imported lazily), guided with the ``guidance`` backend.

Which one a stage runs, in which dtype and on which device, is decided by
:func:`memreader.core.engines.resolve_engine` and built by :func:`memreader.core.engines.make_engine`; every
backend's ``generate_many`` returns :class:`Reply` objects.
"""

from __future__ import annotations

from typing import Any

from memreader.core.generation.local import LocalChat, generate_chat_batch
from memreader.core.generation.openai_chat import OpenAIChat
from memreader.core.generation.params import (
    GenerationParams,
    GenerationRequestError,
    Messages,
    Reply,
)
from memreader.core.registry import SMOLLM2

__all__ = ["GenerationParams", "GenerationRequestError", "LocalChat", "Messages", "OpenAIChat",
           "Reply", "generate_chat_batch", "make_chat"]


def make_chat(kind: str, model: str = SMOLLM2, dtype: str = "auto", device: str = "auto",
              **settings: Any) -> Any:
    """A chat engine on backend ``kind`` (``transformers``/``local``, ``vllm``, ``openai`` or ``auto``), for scripts
    and examples: :func:`memreader.core.engines.make_engine` of the stage ``chat``'s
    :func:`~memreader.core.engines.resolve_engine`. Stages resolve their own stage and call ``make_engine``."""
    from memreader.core.engines import make_engine, resolve_engine

    return make_engine(resolve_engine("chat", kind, dtype, device), model, **settings)
