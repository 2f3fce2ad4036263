"""The import layers are a checked contract (scripts/check_layers.py, also run by `make lint`)."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("check_layers", ROOT / "scripts" / "check_layers.py")
check_layers = importlib.util.module_from_spec(spec)
sys.modules["check_layers"] = check_layers
spec.loader.exec_module(check_layers)


def test_the_project_keeps_its_layers_and_has_no_import_cycle() -> None:
    assert check_layers.violations() == []


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_every_kind_of_wrong_import_is_caught(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "memreader/__init__.py": "",
        "memreader/cli.py": "import memreader.retrieval.search\n",  # the top imports anything
        "core/__init__.py": "",
        "core/fusion.py": "from memreader.retrieval.search import ask\n",  # core -> stage
        "core/a.py": "def f():\n    from . import b\n",  # a cycle, through a lazy relative import
        "core/b.py": "import memreader.core.a\n",
        "core/lazy.py": "import importlib\nSTAGE = importlib.import_module('memreader.eval.qa')\n",  # core -> stage
        "retrieval/__init__.py": "",
        "retrieval/search.py": "from memreader.data_gen.pipeline import generate\n"  # stage -> sibling stage
                               "if __name__ == '__main__':\n    from memreader.cli import main\n",  # allowed
        "retrieval/chat.py": "from ..cli import main\n",  # below the top, relative
        "data_gen/__init__.py": "",
        "data_gen/pipeline.py": "import json\n",
        "eval/__init__.py": "",
        "eval/qa.py": "from memreader.retrieval.search import ask, _canonical\n",  # allowed direction, private name
        "scripts/bench_a.py": "import sys\nsys.path.insert(0, '.')\nfrom bench_b import helper\n"  # two problems
                              "from memreader.core.fusion import _weights\n"  # private name
                              "from memreader.eval import qa\nqa._cache.clear()\n",  # private attribute
        "scripts/bench_b.py": "from _common import shared\nfrom memreader.cli import main\n",  # both allowed
        "scripts/_common.py": "",
    })
    found = check_layers.violations(root)
    text = "\n".join(found)
    assert "memreader.core.fusion imports memreader.retrieval.search: the core never imports a stage" in text
    assert "memreader.core.lazy imports memreader.eval.qa: the core never imports a stage" in text
    assert "memreader.retrieval.search imports memreader.data_gen.pipeline: a stage never imports a sibling stage" in text
    assert "memreader.retrieval.chat imports memreader.cli: only the top layer" in text
    assert "memreader.eval.qa imports memreader.retrieval.search: private name(s) _canonical" in text
    assert "import cycle among memreader.core.a, memreader.core.b" in text
    assert "scripts/bench_a.py:2: a script edits sys.path" in text
    assert "scripts.bench_a imports scripts.bench_b: a script never imports another script" in text
    assert "scripts.bench_a imports memreader.core.fusion: private name(s) _weights" in text
    assert "scripts/bench_a.py:6: a script reads the private attribute _cache" in text
    # the __main__ block, the top layer, eval -> retrieval, scripts/_common.py and a script on the CLI are allowed
    assert len(found) == 10, found


def test_every_module_imports() -> None:
    """A name moved between modules (and an import a linter dropped as unused) fails here, not in a user's run."""
    import importlib

    for name in check_layers.modules():
        importlib.import_module(name)


_ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"


@pytest.mark.parametrize("folder", check_layers.FOLDERS)
def test_each_folder_names_its_import_path(folder: str) -> None:
    """A reader of `memreader.<x>` is told in the folder itself where it lives: its __init__.py's first line."""
    package = check_layers.FOLDERS[folder][0]
    doc = ast.get_docstring(ast.parse((ROOT / folder / "__init__.py").read_text(encoding="utf-8"))) or ""
    assert doc.startswith(f"``{package}`` (the ``{folder}/`` folder)"), f"{folder}/__init__.py: {doc[:80]!r}"


def test_architecture_maps_every_folder_and_names_every_module() -> None:
    """docs/ARCHITECTURE.md opens with the folder -> import path table; each row names every module of its folder
    (and the subfolder it sits in), so a module added or removed shows up here."""
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)/` \|.*$", _ARCHITECTURE.read_text("utf-8"), re.M)}
    assert set(check_layers.FOLDERS) <= set(rows), sorted(set(check_layers.FOLDERS) - set(rows))
    for folder, (package, layer) in check_layers.FOLDERS.items():
        row = rows[folder]
        assert row.startswith(f"| `{folder}/` | `{package}` | {layer} |"), row[:80]
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name == "__init__.py":
                continue
            parts = path.relative_to(ROOT / folder).parts
            missing = [f"`{p}/`" for p in parts[:-1] if f"`{p}/`" not in row] + \
                [f"`{path.stem}`"] * (f"`{path.stem}`" not in row)
            assert not missing, f"docs/ARCHITECTURE.md's {folder}/ row does not name {', '.join(missing)}"
