"""Stage configs: dataclasses filled from YAML, then overridden by ``--set key=value`` flags.

:func:`load_config` collects *all* problems of a config file before failing; a class lists its own in
``problems()``, and :func:`validate` raises one :class:`ConfigProblems` for a class built in Python.
Details: docs/ARCHITECTURE.md (Configs).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from memreader.core.errors import ConfigError

T = TypeVar("T")
_BOUNDS = {"ge": (">=", lambda v, b: v >= b), "gt": (">", lambda v, b: v > b), "le": ("<=", lambda v, b: v <= b),
           "lt": ("<", lambda v, b: v < b)}


def field(default: Any = dataclasses.MISSING, help: str = "", *, ge: float | None = None,  # noqa: A002
          gt: float | None = None, le: float | None = None, lt: float | None = None,
          check: Callable[[Any], str | None] | None = None, **kw: Any) -> Any:
    """A dataclass field with a help text and, for numbers, its valid range (mutable defaults go
    through ``default_factory``); ``check(value)`` (what is wrong, or None) is the field's own rule where one
    function owns it (``rrf_k``: :func:`memreader.core.fusion.rrf_k_problem`; a word out of a set, e.g. the
    evaluator's keys in :mod:`memreader.core.scoring_settings`), run on a number inside the range or on a string."""
    meta = {"help": help, **{k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt), ("check", check))
                             if v is not None}}
    if isinstance(default, (list, dict)):
        value = default
        return dataclasses.field(default_factory=lambda: type(value)(value), metadata=meta, **kw)
    return dataclasses.field(default=default, metadata=meta, **kw)


def range_problems(config: Any, values: dict[str, Any] | None = None) -> list[str]:
    """Every numeric field of a dataclass (or of ``values``, given for its class) outside its
    declared range, with the range, and every number or string failing its field's own ``check``."""
    out = []
    for f in dataclasses.fields(config):
        if values is not None and f.name not in values:
            continue
        value = values[f.name] if values is not None else getattr(config, f.name)
        if isinstance(value, str) and "check" in f.metadata:
            if problem := f.metadata["check"](value):
                out.append(problem)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        failed = [f"{op} {f.metadata[k]}" for k, (op, ok) in _BOUNDS.items() if k in f.metadata
                  and not ok(value, f.metadata[k])]
        if failed:
            want = " and ".join(f"{op} {f.metadata[k]}" for k, (op, _) in _BOUNDS.items() if k in f.metadata)
            out.append(f"{f.name}={value!r} is out of range: it must be {want}")
        elif "check" in f.metadata and (problem := f.metadata["check"](value)):
            out.append(problem)
    return out


class ConfigProblems(ConfigError):
    """Every problem of one config object, named together (``.problems`` holds the lines)."""

    def __init__(self, owner: str, problems: list[str]) -> None:
        super().__init__(f"{owner}:\n  - " + "\n  - ".join(problems))
        self.problems = problems


def problems_of(config: Any) -> list[str]:
    """A config object's out-of-range fields and its own ``problems()``."""
    own = getattr(config, "problems", None)
    return range_problems(config) + (own() if callable(own) else [])


def validate(config: Any, error: type[ConfigError] | type[Exception] | None = None, what: str = "") -> None:
    """Raise one error naming every problem of ``config`` (for ``__post_init__``): :class:`ConfigProblems`, or
    ``error(problem, fix)`` where a module has its own error type (``what`` names the settings in its message)."""
    found = problems_of(config)
    if not found:
        return
    if error is None:
        raise ConfigProblems(type(config).__name__, found)
    raise error(f"bad {what or type(config).__name__} settings: " + "; ".join(found),
                "fix the values named (in the stage config, or the arguments given)")


def coerce_value(value: Any, annotation: Any, key: str, problems: list[str]) -> Any:
    """``value`` (from YAML or a ``--set``) converted to the field type ``annotation`` where that is
    unambiguous (bool, int, float, str, list, dict, ``X | None``); a value that cannot be converted is
    returned unchanged and a message is appended to ``problems``. Unions of several types (TRL's
    ``dict | str | None``) are passed through for the dataclass to interpret."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:
            return coerce_value(value, non_none[0], key, problems)
        if isinstance(value, bool) and str in non_none and bool not in non_none:
            # YAML 1.1 reads a bare no/off/false as a boolean; the word itself is lost, so name the fix
            problems.append(f"{key}: got the YAML boolean {value!r}, but this key takes a word; quote it, "
                            f"e.g. {key}: \"no\" in YAML or --set '{key}=\"no\"'")
        return value
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        problems.append(f"{key}: expected true/false, got {value!r}")
        return value
    if annotation in (int, float):
        try:
            if annotation is int and isinstance(value, float) and not value.is_integer():
                raise ValueError
            return annotation(value)
        except (TypeError, ValueError):
            problems.append(f"{key}: expected {annotation.__name__}, got {value!r}")
            return value
    if annotation is str:
        if isinstance(value, bool):  # YAML 1.1 reads a bare on/off as a boolean: give the word back
            return "on" if value else "off"
        return value if isinstance(value, str) else str(value)
    if origin in (list, tuple):
        if isinstance(value, str):
            value = yaml.safe_load(value) if value.strip().startswith("[") else [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            problems.append(f"{key}: expected a list, got {value!r}")
            return value
        inner = args[0] if args else Any
        return [coerce_value(v, inner, key, problems) if inner is not Any else v for v in value]
    if origin is dict:
        if isinstance(value, str):
            value = yaml.safe_load(value)
        if not isinstance(value, dict):
            problems.append(f"{key}: expected a mapping, got {value!r}")
        return value
    return value


def parse_override(item: str) -> tuple[str, Any]:
    """One ``--set key=value``: the key, and the value read as YAML (``null``, numbers, lists, mappings)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value (e.g. --set max_new_tokens=256)")
    key, raw = item.split("=", 1)
    try:
        return key.strip(), yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override --set {item!r}: the value is not valid YAML ({_yaml_reason(exc)})",
                          "quote the value, e.g. --set 'key=\"[text\"'") from None


def _yaml_reason(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{getattr(exc, 'problem', None) or exc}{where}"


def read_config_data(path: str | Path | None = None, overrides: list[str] | None = None) -> tuple[dict[str, Any], str]:
    """The ``key: value`` mapping of a YAML file with ``key=value`` overrides applied on top, and where it came
    from (for messages). The one reader of config files and ``--set`` flags."""
    data: dict[str, Any] = {}
    where = "defaults"
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist; pass an existing YAML (see configs/)")
        where = str(path)
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path} is not valid YAML: {_yaml_reason(exc)}", "fix the syntax there") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{path} is not UTF-8 text", "save the config file as UTF-8") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: top level must be a mapping of field: value")
        data.update(loaded)
    data.update(parse_override(item) for item in overrides or [])
    return data, where


def unknown_key_problem(key: str, valid: Iterable[str], listing: str | None = None) -> str:
    """The message for a key no config class knows: its nearest valid key, then ``listing`` (how to see them all)."""
    valid = sorted(valid)
    near = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    hint = f"; the nearest valid key is {near[0]!r}" if near else ""
    return f"unknown key {key!r}{hint} ({listing or 'valid keys: ' + ', '.join(valid)})"


def shortcut_overrides(args: Any, keys: Iterable[str]) -> list[str]:
    """``key=value`` overrides for the shortcut flags given on a command line (``--adapter X`` is
    ``--set adapter=X``); values are written as JSON, which YAML reads back exactly."""
    return [f"{k}={json.dumps(getattr(args, k))}" for k in keys if getattr(args, k, None) is not None]


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Build ``cls`` from a YAML file and ``key=value`` overrides, reporting every problem at once (a key the
    class lists in its ``RENAMED_KEYS`` mapping is named with its new name)."""
    data, where = read_config_data(path, overrides)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    renamed = getattr(cls, "RENAMED_KEYS", {})
    problems = [f"unknown key {k!r}: it is now {renamed[k]!r}" if k in renamed else unknown_key_problem(k, fields)
                for k in data if k not in fields]
    kwargs = {k: coerce_value(v, hints[k], k, problems) for k, v in data.items() if k in fields}
    missing = [n for n, f in fields.items()
               if n not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    problems += [f"missing required key {n!r}: {fields[n].metadata.get('help', '')}" for n in missing]
    cfg = None
    if not missing:
        try:
            cfg = cls(**kwargs)
        except ConfigProblems as exc:  # a class that validates itself: its lines join the others
            problems += exc.problems
        except (TypeError, ValueError) as exc:  # reported below with the other problems
            problems.append(f"cannot build {cls.__name__}: {exc}")
    # ranges and the run name are checked on the values given even when the config could not be built
    problems += range_problems(cfg) if cfg is not None else range_problems(cls, kwargs)
    run_name = cfg.run if cfg is not None and "run" in fields else kwargs.get("run")
    if "run" in fields and isinstance(run_name, str):
        from memreader.core.paths import run_name_problem

        if bad_run := run_name_problem(run_name):
            problems.append(bad_run)
    own = getattr(cfg, "problems", None)
    if callable(own):
        try:
            problems += own()
        except (TypeError, ValueError) as exc:  # a check tripping over an already-reported bad type
            if not problems:
                raise
            problems.append(f"(further checks stopped at: {exc!r})")
    if problems:
        problems = list(dict.fromkeys(problems))  # a self-validating class may have named a range problem too
        raise ConfigError(f"config {where} for {cls.__name__}:\n  - " + "\n  - ".join(problems))
    return cfg


def describe_config(cls: type) -> str:
    """A help text listing every field, its default and its help (for ``--help``)."""
    lines = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else "(required)")
        lines.append(f"  {f.name} = {default!r}\n      {f.metadata.get('help', '')}")
    return "config keys (set in YAML or with --set key=value):\n" + "\n".join(lines)


def add_config_arguments(parser: Any, example_dir: str) -> None:
    """The ``--config`` / ``--set`` flags every stage takes (``example_dir``: where its YAMLs live)."""
    parser.add_argument("--config", help=f"YAML file of config keys (examples in {example_dir})")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
