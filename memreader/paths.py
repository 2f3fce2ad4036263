"""Where artifacts live: everything under ``$MEMREADER_HOME`` (default ``./artifacts``)."""

from __future__ import annotations

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


def run_dir(run: str | None, stage: str | None = None) -> Path:
    """``$MEMREADER_HOME/runs/<run>[/<stage>]``; ``run`` defaults to a timestamp."""
    name = run or time.strftime("%Y%m%d-%H%M%S")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise ValueError(f"run name {name!r} may only contain letters, digits, '.', '_' and '-'")
    path = memreader_home() / "runs" / name
    if stage:
        path = path / stage
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_resolved_config(folder: Path, config: Any, name: str = "config.yaml") -> Path:
    """Write the fully resolved config of a stage next to its outputs."""
    data = asdict(config) if is_dataclass(config) else dict(config)
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def write_json(path: Path, data: Any) -> Path:
    """Pretty JSON, UTF-8, parent folders created."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return path
