"""The import layers are a checked contract (scripts/check_layers.py, also run by `make lint`)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

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
        "memreader/cli.py": "import retrieval.search\n",  # the top imports anything
        "memreader/fusion.py": "from retrieval.search import ask\n",  # core -> stage
        "memreader/a.py": "def f():\n    from memreader import b\n",  # a cycle, through a lazy import
        "memreader/b.py": "import memreader.a\n",
        "retrieval/__init__.py": "",
        "retrieval/search.py": "from data_gen.pipeline import generate\n"  # stage -> sibling stage
                               "if __name__ == '__main__':\n    from memreader.cli import main\n",  # allowed
        "retrieval/chat.py": "from memreader.cli import main\n",  # below the top
        "data_gen/__init__.py": "",
        "data_gen/pipeline.py": "import json\n",
        "eval/__init__.py": "",
        "eval/qa.py": "from retrieval.search import ask, _canonical\n",  # allowed direction, private name
    })
    found = check_layers.violations(root, ("memreader", "retrieval", "data_gen", "eval"))
    text = "\n".join(found)
    assert "memreader.fusion imports retrieval.search: the core never imports a stage" in text
    assert "retrieval.search imports data_gen.pipeline: a stage never imports a sibling stage" in text
    assert "retrieval.chat imports memreader.cli: only the top layer" in text
    assert "eval.qa imports retrieval.search: private name(s) _canonical" in text
    assert "import cycle among memreader.a, memreader.b" in text
    assert len(found) == 5, found  # the __main__ block, the top layer and eval -> retrieval are allowed


def test_every_module_imports() -> None:
    """A name moved between modules (and an import a linter dropped as unused) fails here, not in a user's run."""
    import importlib

    for name in check_layers.modules():
        importlib.import_module(name)
