"""Scripted engines behind the real engine switch: the classes :func:`memreader.core.engines.make_engine` builds
(``LocalChat``, ``VLLMChat``, ``OpenAIChat``) are replaced where they live, so a stage's own resolution and the
factory run for real and only the model is scripted. Every build is recorded, and its keywords are checked against
the real class's signature (a stage passing ``model_name=`` to a class that takes ``model=`` fails here)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import pytest

MODULES = {"transformers": ("memreader.core.generation.local", "LocalChat"),
           "vllm": ("memreader.core.generation.vllm_chat", "VLLMChat"),
           "openai": ("memreader.core.generation.openai_chat", "OpenAIChat")}


@dataclass
class Built:
    """One engine the factory built: which backend, for which model, with which keywords."""

    backend: str
    model: str
    kwargs: dict[str, Any] = field(default_factory=dict)


def fake_engines(monkeypatch: pytest.MonkeyPatch, engine: Any = None) -> list[Built]:
    """Every engine built from now on is ``engine`` (a scripted fake; ``engine`` may also be a callable
    ``(Built) -> fake``); returns the list of builds, in order."""
    import importlib

    built: list[Built] = []
    for backend, (module_name, class_name) in MODULES.items():
        module = importlib.import_module(module_name)
        real = getattr(module, class_name)
        real = getattr(real, "real_class", real)  # patched before in this test: the class beneath

        def build(*args: Any, _backend: str = backend, _real: Any = real, **kwargs: Any) -> Any:
            inspect.signature(_real).bind(*args, **kwargs)  # a keyword the real class does not take fails here
            record = Built(_backend, kwargs.get("model", args[0] if args else ""), kwargs)
            built.append(record)
            return engine(record) if callable(engine) and not hasattr(engine, "generate_many") else engine

        build.real_class = real  # type: ignore[attr-defined]
        monkeypatch.setattr(module, class_name, build)
    return built
