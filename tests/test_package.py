"""One installed namespace: the built wheel holds only ``memreader`` (the stage folders as its subpackages, the
templates, the demo's configs and data), it imports and runs outside the checkout, and ``memreader demo`` names only
files the package ships."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from memreader.demo import DEMO_CONFIGS, DemoConfig, demo_steps

pytestmark = pytest.mark.heavy

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of what pyproject.toml packages (setuptools writes its build/ folder beside the
    sources: the checkout stays untouched)."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    from setuptools.config.pyprojecttoml import (
        read_configuration,  # setuptools' own reader (any Python >= 3.10)
    )

    project = read_configuration(REPO / "pyproject.toml")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for folder in set(project["tool"]["setuptools"]["package-dir"].values()):
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(src)], check=True, cwd=out)
    (built,) = out.glob("memreader-*.whl")
    return built


def test_the_wheel_installs_one_top_level_name(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"memreader"}, top
    for needed in ("memreader/core/schema.py", "memreader/eval/chunkers/base.py", "memreader/training/sft.py",
                   "memreader/core/templates/memreader.en.txt", "memreader/demo_data/corpus.jsonl",
                   "memreader/demo_data/qa.jsonl", "memreader/demo_data/cut_head/head.json",
                   "memreader/demo_data/cut_head/head.safetensors", *(f"memreader/demo_data/configs/{c.name}"
                                                     for c in DEMO_CONFIGS.glob("*.yaml"))):
        assert needed in names, f"{needed} is not in the wheel"


def test_the_installed_wheel_imports_and_runs_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True)
    env = {**os.environ, "PYTHONPATH": str(target)}
    probe = ("import memreader.eval.metrics, memreader.core.prompts, memreader.demo as d\n"
             "print(memreader.eval.metrics.__file__)\n"
             "print(memreader.core.prompts.load_template('memreader', 'en').id)\n"
             "print(sorted(p.name for p in d.DEMO_CONFIGS.glob('*.yaml')))\n"
             "import importlib.util\n"
             "print([n for n in ('eval', 'training', 'inference', 'retrieval', 'data_gen', 'ingest', 'core')"
             " if importlib.util.find_spec(n)])\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    file, template, configs, stray = done.stdout.splitlines()
    assert Path(file).is_relative_to(target), file
    assert template.startswith("memreader.en")
    assert configs == str(sorted(p.name for p in DEMO_CONFIGS.glob("*.yaml")))
    assert stray == "[]", f"top-level names importable from the installed wheel: {stray}"
    helped = subprocess.run([sys.executable, "-m", "memreader.cli", "--help"], cwd=tmp_path, env=env,
                            capture_output=True, text=True)
    assert helped.returncode == 0 and "demo" in helped.stdout, helped.stderr
    # the product steps that were scripts are commands of the wheel (issue 48)
    assert all(f"  {name} " in helped.stdout for name in ("measure-engines", "calibrate-meve", "checkpoint",
                                                          "setup-wordnet")), helped.stdout


def test_memreader_demo_names_only_packaged_files() -> None:
    """The demo names the package's configs and data, so it runs without the checkout (configs/demo is a link to the
    package's folder; the stages and keys: tests/test_scripts.py::test_every_demo_call_uses_known_configs_and_keys)."""
    assert (REPO / "configs" / "demo").resolve() == DEMO_CONFIGS.resolve()
    for _, command in demo_steps(DemoConfig(), "memreader"):
        paths = [a.split("=", 1)[-1] for a in command if a.endswith((".yaml", ".jsonl")) and "runs" not in a]
        assert all(Path(p).is_file() for p in paths), command
        assert paths or command[1] in ("report", "index", "ask", "view"), command
