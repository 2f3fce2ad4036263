"""One backend setting for every model call: ``transformers | vllm | openai | auto``.

Every stage that runs a model (reading, the local teacher, the evaluator scorer, QA answering, informational
support, the MeVe verifier and the chat) takes ``backend`` (``local`` and ``hf`` are older names of ``transformers``) and ``dtype``
(``auto | float32 | bfloat16``). ``auto`` is decided per stage by measurement on this machine:

1. ``scripts/bench_engines.py`` times every backend x dtype per stage on the machine it runs on and records the
   fastest in ``$MEMREADER_HOME/engine_choice.json`` (keyed by CPU model / GPU name, torch and core count);
   ``auto`` takes that row when the file has one for this machine.
2. Without a recorded measurement: vLLM when it imports, for the generating stages (reading, teacher, answering,
   chat), informational support and the MeVe verifier, and transformers for the evaluator scorer. That is what
   the measurements in docs/BENCHMARKS.md found on this project's two-core CPUs (vLLM's CPU build in process,
   bf16: guided reading 4.5x, answering 3.5x, support 1.2x, verifier 1.4x, chat 1.46x the transformers bf16 rows;
   the batched transformers scorer 1.03x vLLM's ``prompt_logprobs``), and what holds on a GPU; a machine where it
   does not hold gets its own rows by running the benchmark.

The dtype's ``auto`` is the cached matmul probe (:mod:`memreader.core.hardware`). Every run records the backend and
dtype that produced it (:func:`describe_choice`).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from memreader.core.paths import memreader_home, write_atomic

log = logging.getLogger(__name__)

BACKENDS = ("transformers", "vllm", "openai", "auto")
LOCAL_BACKENDS = ("transformers", "vllm")
BACKEND_ALIASES = {"local": "transformers", "hf": "transformers"}
STAGES = ("read", "teacher", "scorer", "answer", "support", "verifier", "chat")
CHOICE_FILE = "engine_choice.json"
DEFAULTS = {"read": "vllm", "teacher": "vllm", "answer": "vllm", "support": "vllm", "scorer": "transformers",
            "verifier": "vllm", "chat": "vllm"}


def canonical_backend(name: str) -> str:
    """``local``/``hf`` → ``transformers``; other names as given."""
    return BACKEND_ALIASES.get(name, name)


def backend_problem(name: str, allowed: tuple[str, ...] = BACKENDS, key: str = "backend") -> str | None:
    """A config problem line for an unknown backend name, else None."""
    if canonical_backend(name) in allowed:
        return None
    return f"{key}: {name!r} is not one of {', '.join(allowed)}"


STAGE_DTYPES = ("auto", "float32", "bfloat16")


def dtype_problem(dtype: str, key: str = "dtype") -> str | None:
    """A config problem line for a stage dtype outside ``auto | float32 | bfloat16``, else None."""
    return None if dtype in STAGE_DTYPES else f"{key}: {dtype!r} is not one of {', '.join(STAGE_DTYPES)}"


def machine_key() -> str:
    """What a measurement is valid for: the accelerator (or CPU model), torch, and the cores this process may use."""
    import torch
    from memreader.core.hardware import cpu_model

    if torch.cuda.is_available():
        device = "cuda:" + torch.cuda.get_device_name(0)
    else:
        device = "cpu:" + cpu_model()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return f"{device}|torch={torch.__version__}|cores={cores}"  # not torch's thread count: stages change it


def _choice_path() -> Path:
    return memreader_home() / CHOICE_FILE


def measured_choices() -> dict[str, Any]:
    """This machine's recorded fastest rows per stage (``{stage: {"backend", "dtype", ...}}``), or ``{}``."""
    path = _choice_path()
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        log.warning("%s is unreadable (%s): backend auto ignores it", path, exc)
        return {}
    entry = data.get(machine_key(), {})
    return entry if isinstance(entry, dict) else {}


def record_choices(choices: dict[str, dict[str, Any]]) -> Path:
    """Store this machine's fastest rows per stage (``scripts/bench_engines.py`` calls it)."""
    unknown = sorted(set(choices) - set(STAGES))
    if unknown:
        raise ValueError(f"unknown stages {unknown}; stages are {', '.join(STAGES)}")
    path = _choice_path()
    data: dict[str, Any] = {}
    if path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            data = {}
    data[machine_key()] = {**data.get(machine_key(), {}), **choices}
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def resolve_backend(name: str, stage: str) -> tuple[str, str]:
    """(backend, why) for a stage's ``backend`` setting: ``auto`` resolved as the module docstring says."""
    name = canonical_backend(name)
    if name != "auto":
        return name, "set"
    from memreader.core.vllm_engine import vllm_available, vllm_import_error

    row = measured_choices().get(stage)
    if row and row.get("backend") in LOCAL_BACKENDS:
        if row["backend"] == "vllm" and not vllm_available():
            log.warning("backend auto: the recorded fastest %s backend on this machine is vllm, but vLLM does not "
                        "import here (%s); using transformers", stage, vllm_import_error())
            return "transformers", "measured vllm, not importable"
        return str(row["backend"]), f"measured ({_choice_path()})"
    default = DEFAULTS[stage]
    if default == "vllm" and not vllm_available():
        log.warning("backend auto for %s: vLLM does not import here (%s); using transformers", stage,
                    vllm_import_error())
        return "transformers", "vLLM does not import here (make setup installs it)"
    return default, "default for this stage (no measurement recorded here: scripts/bench_engines.py records one)"


def resolve_dtype_for(stage: str, dtype: str, backend: str) -> str:
    """A stage's ``dtype`` setting: ``auto`` takes the recorded fastest dtype for this stage and backend when one
    was measured, else the probe's (:func:`memreader.core.vllm_engine.resolve_dtype`)."""
    if dtype != "auto":
        return dtype
    row = measured_choices().get(stage)
    if row and row.get("backend") == backend and row.get("dtype") in ("float32", "bfloat16"):
        return str(row["dtype"])
    from memreader.core.vllm_engine import resolve_dtype

    return resolve_dtype("auto")


def describe_choice(stage: str, backend: str, dtype: str, why: str = "") -> dict[str, Any]:
    """The record every run keeps of what produced it."""
    return {"stage": stage, "backend": backend, "dtype": dtype, **({"why": why} if why else {})}
