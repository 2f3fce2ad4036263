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
