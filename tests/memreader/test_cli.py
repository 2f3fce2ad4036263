"""Every subcommand answers --help, and the top-level help lists them all."""

from __future__ import annotations

import pytest

from memreader.cli import COMMANDS, main


def test_top_level_help(capsys) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_subcommand_help(name, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    assert f"memreader {name}" in capsys.readouterr().out


def test_unknown_command_fails_clearly(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["fly"])
    assert exc.value.code == 2
    assert "unknown command 'fly'" in capsys.readouterr().err


def test_user_errors_are_reported_without_traceback(tmp_path, capsys) -> None:
    assert main(["read", "--set", f"input={tmp_path / 'missing.jsonl'}"]) == 2
    err = capsys.readouterr().err
    assert "memreader read: error: corpus file" in err and "does not exist" in err and "Traceback" not in err
    assert main(["gen", "--set", "teacher=foo"]) == 2
    err = capsys.readouterr().err
    assert "teacher: 'foo' is not one of transformers, vllm, openai, auto, local" in err and "input: give a corpus" in err
