"""The dependency floors in pyproject.toml, read from pyproject.toml alone: every installed package satisfies its
requirement; every floor whose comment names its package with a version ("transformers 5.0: a float warmup_steps
...") is not below that version, so a floor lowered without its reason fails; the training stack's floors carry
such a reason; and the APIs those reasons name exist in the installed versions."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as a package
    tomllib = pytest.importorskip("tomli")

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
# Floors that must say why (pyproject.toml holds the versions and the reasons; this is only the list of names):
# the training stack, whose floors are the oldest releases providing what training/ and inference/ call.
EXPLAINED = ("transformers", "trl", "peft", "accelerate", "datasets")


def _requirement_strings(text: str, extras: bool) -> list[str]:
    project = tomllib.loads(text)["project"]
    reqs = list(project["dependencies"])
    if extras:
        reqs += [r for group in project["optional-dependencies"].values() for r in group]
    return reqs


def _requirements(text: str, extras: bool) -> list[Requirement]:
    return [Requirement(r) for r in _requirement_strings(text, extras)]


def _floor(req: Requirement) -> Version | None:
    floors = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
    return max(floors) if floors else None


def documented_floors(text: str) -> dict[str, tuple[str, Version, str]]:
    """``name -> (requirement as written, version, comment)`` for every requirement of ``[project]`` (dependencies and
    optional dependencies, as tomllib reads them) whose comment names the package followed by a version. A
    requirement's comment is the block of comment lines above it, or above the run of requirement lines it belongs
    to; where the comment names several versions of the package, the highest counts."""
    listed = {r: Requirement(r) for r in _requirement_strings(text, extras=True)}
    found: dict[str, tuple[str, Version, str]] = {}
    block: list[str] = []
    after_comment = False
    project = text.split("\n[project]\n", 1)[1].split("\n[tool.", 1)[0]
    for line in project.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            if not after_comment:
                block = []
            block.append(stripped.lstrip("#").strip())
            after_comment = True
            continue
        after_comment = False
        written = [s for s in re.findall(r'"([^"]+)"', line) if s in listed]
        if not written:
            block = []  # a blank line or another key ends the comment's reach
            continue
        comment = " ".join(block)
        for raw in written:
            name = re.escape(listed[raw].name).replace(r"\-", "[-_ ]?")
            named = re.findall(rf"(?<![\w-]){name}(?![\w-])\s+v?(\d+(?:\.\d+)*)", comment, flags=re.IGNORECASE)
            if named:
                found[canonicalize_name(listed[raw].name)] = (raw, max(Version(v) for v in named), comment)
    return found


def floor_problems(text: str) -> list[str]:
    """What is wrong with the floors of this pyproject.toml text: a floor below the version its comment names, or
    a training-stack requirement without such a comment."""
    documented = documented_floors(text)
    problems = []
    for name, (raw, version, comment) in sorted(documented.items()):
        floor = _floor(Requirement(raw))
        if floor is None or floor < version:
            problems.append(f"pyproject.toml: {raw}, but its comment names {name} {version}: {comment}")
    for name in EXPLAINED:
        if canonicalize_name(name) not in documented:
            problems.append(f"pyproject.toml: the {name} requirement has no comment naming the release it needs "
                            f"('{name} X.Y: why')")
    return problems


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def test_every_installed_dependency_satisfies_pyproject():
    """Core dependencies must be installed; optional ones (gpu, dev) are checked where installed."""
    text = PYPROJECT.read_text(encoding="utf-8")
    core = {req.name for req in _requirements(text, extras=False)}
    problems = []
    for req in _requirements(text, extras=True):
        version = _installed(req.name)
        if version is None:
            if req.name in core:
                problems.append(f"{req.name} is not installed (pyproject: {req})")
            continue
        if not req.specifier.contains(version, prereleases=True):
            problems.append(f"{req.name} {version} is installed, but pyproject.toml asks for {req}")
    assert not problems, "\n".join(problems)


def test_floors_are_not_below_the_releases_their_comments_name():
    text = PYPROJECT.read_text(encoding="utf-8")
    assert not floor_problems(text), "\n".join(floor_problems(text))
    documented = documented_floors(text)
    assert {canonicalize_name(n) for n in EXPLAINED} <= set(documented)


def test_a_lowered_or_unexplained_floor_is_caught():
    """The check above can fail: every documented floor, lowered in a copy of pyproject.toml, is named; a training
    requirement whose comment is gone is named too."""
    text = PYPROJECT.read_text(encoding="utf-8")
    documented = documented_floors(text)
    for name, (raw, _, _) in documented.items():
        lowered = text.replace(f'"{raw}"', f'"{name}>=0.0.1"', 1)
        assert lowered != text and any(f"{name}>=0.0.1" in p for p in floor_problems(lowered)), name
    trl = documented["trl"][2]
    stripped = "\n".join(line for line in text.splitlines() if not (line.lstrip().startswith("#") and "TRL 0.28:" in line))
    assert trl and stripped != text
    assert any("the trl requirement has no comment" in p for p in floor_problems(stripped))


def test_installed_libraries_have_the_apis_the_floors_name():
    """What the floors stand for, checked on the installed versions."""
    from transformers import TrainingArguments
    from trl import SFTConfig, TrlParser

    fields = {f.name: f for f in dataclasses.fields(SFTConfig)}
    assert "completion_only_loss" in fields and "max_length" in fields and "max_seq_length" not in fields
    assert "warmup_ratio" not in {f.name for f in dataclasses.fields(TrainingArguments)} or Version(
        importlib.metadata.version("transformers")) < Version("5.2.0")
    args = TrainingArguments(output_dir="unused", warmup_steps=0.03, use_cpu=True, report_to="none")
    assert args.get_warmup_steps(1000) == 30, "a float warmup_steps below 1 must be a fraction of the steps"
    assert callable(TrlParser.parse_dict)
