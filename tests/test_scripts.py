"""scripts/runcpu.sh and scripts/speedrun.sh: valid bash, and every stage call names configs that exist and only
keys its stage knows (speedrun.sh needs a GPU and cannot run here, so its calls are checked statically)."""

from __future__ import annotations

import dataclasses
import importlib
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from memreader.cli import COMMANDS

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = ["scripts/runcpu.sh", "scripts/speedrun.sh"]


def stage_calls(script: Path) -> list[tuple[str, list[str]]]:
    """(stage, argv after the stage name) of every ``memreader <stage>`` / ``-m training.sft`` call."""
    text = script.read_text(encoding="utf-8").replace("\\\n", " ")
    calls = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#") or not line:
            continue
        line = re.sub(r'"\$\(.*?\)"', "QUESTION", line)  # command substitutions stand for one argument
        words = shlex.split(line.split(" > ")[0], comments=True)
        for i, word in enumerate(words):
            if word in ("$MEMREADER", "memreader") and i + 1 < len(words):
                calls.append((words[i + 1], words[i + 2:]))
            elif word == "-m" and i + 1 < len(words) and words[i + 1] == "training.sft":
                calls.append(("train", words[i + 2:]))
    return calls


def valid_keys(stage: str) -> set[str]:
    if stage == "train":
        from training.config import key_sets

        return set().union(*key_sets().values())
    module = importlib.import_module(COMMANDS[stage][0])
    return {f.name for f in dataclasses.fields(module.CONFIG_CLASS)}


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_is_valid_bash(script: str) -> None:
    subprocess.run(["bash", "-n", str(REPO / script)], check=True)


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_stage_call_uses_known_configs_and_keys(script: str) -> None:
    calls = stage_calls(REPO / script)
    assert len(calls) >= 6, calls
    for stage, argv in calls:
        assert stage in COMMANDS, f"{script}: unknown stage {stage!r}"
        keys: list[str] = []
        for flag, value in zip(argv, argv[1:], strict=False):
            if flag == "--config":
                path = REPO / value
                assert path.is_file(), f"{script}: {stage} --config {value} does not exist"
                keys += list(yaml.safe_load(path.read_text(encoding="utf-8")))
            elif flag == "--set":
                keys.append(value.split("=", 1)[0])
        if stage in ("report",) or (stage == "demo" and not keys):
            continue
        unknown = sorted(set(keys) - valid_keys(stage))
        assert not unknown, f"{script}: {stage} is given unknown key(s) {unknown}"


def test_the_checker_catches_an_unknown_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sh"
    bad.write_text('memreader gen --config configs/demo/gen.yaml --set scorer_backend=vllm\n', encoding="utf-8")
    (stage, argv), = stage_calls(bad)
    assert stage == "gen" and "scorer_backend" not in valid_keys(stage)


def test_make_demo_runs_runcpu() -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^demo: setup\n\t.*bash scripts/runcpu\.sh", makefile, re.M)
