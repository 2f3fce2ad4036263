"""scripts/speedrun.sh: valid bash, and every stage call names configs that exist and only keys its stage knows (it
needs a GPU and cannot run here, so its calls are checked statically); the demo's calls (memreader demo, what make demo
runs) are checked the same way."""

from __future__ import annotations

import dataclasses
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from memreader.cli import COMMANDS
from memreader.cli import stage as cli_stage

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = ["scripts/speedrun.sh"]


def script_variables(text: str) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Arrays (``NAME=(...)``, every definition's words together) and YAML-valued scalars (``NAME=x.yaml``, every
    value assigned) of a script, so calls that use ``"${GEN[@]}"`` or ``--config "$TRAIN_CONFIG"`` are checked too."""
    arrays: dict[str, list[str]] = {}
    for name, body in re.findall(r"\b(\w+)=\((.*?)\)", text, flags=re.S):
        arrays.setdefault(name, []).extend(shlex.split(body.replace("\\\n", " "), comments=True))
    scalars: dict[str, list[str]] = {}
    for name, value in re.findall(r"\b(\w+)=([\w./-]+\.yaml)\b", text):
        scalars.setdefault(name, []).append(value)
    return arrays, scalars


def stage_calls(script: Path) -> list[tuple[str, list[str]]]:
    """(stage, argv after the stage name) of every ``memreader <stage>`` / ``-m memreader.training.sft`` call; an array
    expansion stands for every word the script ever puts in that array, a ``$NAME`` config for each of its values
    (one call per value)."""
    raw = script.read_text(encoding="utf-8")
    arrays, scalars = script_variables(raw)
    text = raw.replace("\\\n", " ")
    calls = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#") or not line:
            continue
        line = re.sub(r'"\$\(.*?\)"', "QUESTION", line)  # command substitutions stand for one argument
        words = []
        for word in shlex.split(line.split(" > ")[0], comments=True):
            array = re.fullmatch(r"\$\{(\w+)\[@\]\}", word)
            words += arrays.get(array.group(1), []) if array else [word]
        for i, word in enumerate(words):
            if word in ("$MEMREADER", "memreader") and i + 1 < len(words):
                calls.append((words[i + 1], words[i + 2:]))
            elif word == "-m" and i + 1 < len(words) and words[i + 1] == "memreader.training.sft":
                calls.append(("train", words[i + 2:]))
    return calls


def valid_keys(stage: str) -> set[str]:
    if stage == "train":
        from memreader.training.config import key_sets

        return set().union(*key_sets().values())
    return {f.name for f in dataclasses.fields(cli_stage(stage).config)}


@pytest.mark.heavy
@pytest.mark.parametrize("script", SCRIPTS)
def test_script_is_valid_bash(script: str) -> None:
    subprocess.run(["bash", "-n", str(REPO / script)], check=True)


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_stage_call_uses_known_configs_and_keys(script: str) -> None:
    calls = stage_calls(REPO / script)
    _, scalars = script_variables((REPO / script).read_text(encoding="utf-8"))
    assert len(calls) >= 6, calls
    for stage, argv in calls:
        assert stage in COMMANDS, f"{script}: unknown stage {stage!r}"
        keys: list[str] = []
        for flag, value in zip(argv, argv[1:], strict=False):
            if flag == "--config":
                for one in scalars.get(value.lstrip("$"), []) if value.startswith("$") else [value]:
                    path = REPO / one
                    assert path.is_file(), f"{script}: {stage} --config {one} does not exist"
                    keys += list(yaml.safe_load(path.read_text(encoding="utf-8")))
                assert not value.startswith("$") or scalars.get(value.lstrip("$")), f"{script}: {value} is never set"
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


def test_make_demo_runs_memreader_demo() -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^demo: setup\n\t\$\(BIN\)/memreader demo$", makefile, re.M)


def test_every_demo_call_uses_known_configs_and_keys() -> None:
    """The demo's commands (memreader.demo.demo_steps): configs the package ships, keys their stage knows (the check
    scripts/runcpu.sh had before the demo became its one pipeline, issue 48)."""
    from memreader.demo import DemoConfig, demo_steps

    steps = demo_steps(DemoConfig(), "memreader")
    assert [command[1] for _, command in steps] == ["gen", "train", "read", "index", "ask", "ask", "eval", "report",
                                                    "view", "view"]
    for _, command in steps:
        stage, argv = command[1], command[2:]
        keys: list[str] = []
        for flag, value in zip(argv, argv[1:], strict=False):
            if flag == "--config":
                assert Path(value).is_file(), f"{stage} --config {value} does not exist"
                keys += list(yaml.safe_load(Path(value).read_text(encoding="utf-8")))
            elif flag == "--set":
                keys.append(value.split("=", 1)[0])
        unknown = sorted(set(keys) - valid_keys(stage)) if stage not in ("report", "view") else []
        assert not unknown, f"demo: {stage} is given unknown key(s) {unknown}"


def test_the_checker_expands_arrays_and_config_variables(tmp_path: Path) -> None:
    script = tmp_path / "arrays.sh"
    script.write_text('GEN=(--set limit=2\n  --set scorer_backend=vllm)\nCFG=configs/demo/gen.yaml\n'
                      'memreader gen --config "$CFG" "${GEN[@]}"\n', encoding="utf-8")
    (stage, argv), = stage_calls(script)
    assert argv == ["--config", "$CFG", "--set", "limit=2", "--set", "scorer_backend=vllm"]
    assert script_variables(script.read_text())[1] == {"CFG": ["configs/demo/gen.yaml"]}
