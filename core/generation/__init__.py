"""One generation layer for every stage: decoding settings, replies, and the chat backends.

- :class:`LocalChat` — transformers in process (CPU or GPU), batched, guided by llguidance;
- :class:`OpenAIChat` — any OpenAI-compatible server; grammars go to servers that take them;
- :class:`VLLMChat` — vLLM offline on GPU (imported lazily), guided with the ``guidance`` backend.

Every backend's ``generate_many(messages_list, params, ..., grammars=...)`` returns :class:`Reply`
objects carrying ``finish_reason``, token counts and whether a grammar guided them.
"""

from __future__ import annotations

from typing import Any

from memreader.core.generation.local import LocalChat, generate_chat_batch
from memreader.core.generation.openai_chat import OpenAIChat
from memreader.core.generation.params import (
    ChatBackend,
    GenerationParams,
    GenerationRequestError,
    Messages,
    Reply,
)

__all__ = ["ChatBackend", "GenerationParams", "GenerationRequestError", "LocalChat", "Messages", "OpenAIChat",
           "Reply", "generate_chat_batch", "make_chat"]


def make_chat(kind: str, **kw: Any) -> OpenAIChat | LocalChat:
    """``"openai"`` → :class:`OpenAIChat` (any OpenAI-compatible URL), ``"local"`` → :class:`LocalChat`,
    ``"vllm"`` → :class:`memreader.core.generation.vllm_chat.VLLMChat` (GPU extra)."""
    if kind == "vllm":
        from memreader.core.generation.vllm_chat import VLLMChat

        return VLLMChat(**kw)  # type: ignore[return-value]
    kinds: dict[str, Any] = {"openai": OpenAIChat, "local": LocalChat}
    if kind not in kinds:
        raise ValueError(f"backend kind {kind!r} is not one of {sorted([*kinds, 'vllm'])}; use 'openai' for any "
                         "HTTP endpoint")
    return kinds[kind](**kw)
