"""The dependency floors in pyproject.toml: every installed package satisfies its requirement, and the
training stack's floors are never lowered below the releases whose APIs the code calls."""

from __future__ import annotations

import dataclasses
import importlib.metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as a package
    tomllib = pytest.importorskip("tomli")

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
# The oldest release that provides what training/ and inference/ call, and why (see the comments in
# pyproject.toml). Raising a floor is fine; lowering one below these reintroduces a known failure.
MINIMUM = {
    "transformers": ("5.0.0", "a float warmup_steps < 1 is a ratio (warmup_ratio removed in 5.2); dtype= in "
                              "from_pretrained"),
    "trl": ("0.28.0", "conversational prompt-completion SFT on transformers 5; completion_only_loss; max_length"),
    "peft": ("0.18.0", "the first PEFT release that works with transformers 5"),
    "accelerate": ("1.4.0", "TRL 0.28's floor"),
    "datasets": ("3.0.0", "TRL 0.28's floor"),
}


def _requirements(extras: bool) -> list[Requirement]:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    if extras:
        reqs += [Requirement(r) for group in project["optional-dependencies"].values() for r in group]
    return reqs


def _floor(req: Requirement) -> Version | None:
    floors = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
    return max(floors) if floors else None


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def test_every_installed_dependency_satisfies_pyproject():
    """Core dependencies must be installed; optional ones (gpu, dev) are checked where installed."""
    core = {req.name for req in _requirements(extras=False)}
    problems = []
    for req in _requirements(extras=True):
        version = _installed(req.name)
        if version is None:
            if req.name in core:
                problems.append(f"{req.name} is not installed (pyproject: {req})")
            continue
        if not req.specifier.contains(version, prereleases=True):
            problems.append(f"{req.name} {version} is installed, but pyproject.toml asks for {req}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", sorted(MINIMUM))
def test_training_floors_are_not_below_the_apis_used(name: str):
    req = next((r for r in _requirements(extras=False) if r.name == name), None)
    assert req is not None, f"{name} is missing from [project.dependencies]"
    minimum, why = MINIMUM[name]
    floor = _floor(req)
    assert floor is not None and floor >= Version(minimum), (
        f"pyproject.toml: {req}; the code needs {name}>={minimum} ({why})")


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
