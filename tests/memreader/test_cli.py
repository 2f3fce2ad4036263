"""Every subcommand answers --help, and the top-level help lists them all."""

from __future__ import annotations

import os

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
    assert main(["fly"]) == 2
    assert "unknown command 'fly'" in capsys.readouterr().err


def test_every_command_is_one_stage_of_its_module() -> None:
    from memreader.cli import stage
    from memreader.core.stage import Stage

    for name, module in COMMANDS.items():
        described = stage(name)
        assert isinstance(described, Stage) and described.name == name and described.help, module


def test_set_wins_over_its_shortcut_flag(tmp_path) -> None:
    """One precedence rule for every stage: a shortcut flag is an earlier --set, so an explicit --set wins."""
    from memreader.cli import stage

    merge = stage("merge")
    args = merge.parser().parse_args(["--adapter", "a", "--set", "adapter=b", "--dtype", "float32"])
    assert merge.overrides(args) == ['adapter="a"', 'dtype="float32"', "adapter=b"]
    ask = stage("ask")
    args = ask.parser().parse_args(["--pipeline", "meve", "--set", "pipeline=layers", "q"])
    assert ask.configure(args).pipeline == "layers"


@pytest.mark.heavy
def test_python_dash_m_is_the_same_command(tmp_path) -> None:
    import subprocess
    import sys

    for module, name in (("memreader.inference.reader", "read"), ("memreader.eval.score", "score"), ("memreader.training.sft", "train")):
        proc = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and f"memreader {name}" in proc.stdout, proc.stderr[-2000:]
    proc = subprocess.run([sys.executable, "-m", "memreader.inference.reader", "--set", f"input={tmp_path / 'none.jsonl'}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "memreader read: error: corpus file" in proc.stderr


def test_user_errors_are_reported_without_traceback(tmp_path, capsys) -> None:
    assert main(["read", "--set", f"input={tmp_path / 'missing.jsonl'}"]) == 2
    err = capsys.readouterr().err
    assert "memreader read: error: corpus file" in err and "does not exist" in err and "Traceback" not in err
    assert main(["gen", "--set", "teacher=foo"]) == 2
    err = capsys.readouterr().err
    assert "teacher: 'foo' is not one of transformers, vllm, openai, auto, local" in err and "input: give a corpus" in err


def test_a_bug_keeps_its_traceback_even_from_the_project_s_own_code(monkeypatch, capsys) -> None:
    """Only the user-facing error classes (MemReaderError) lose their traceback; a KeyError or a plain
    FileNotFoundError raised inside a stage is a bug or an unforeseen case and must show where it came from."""
    import dataclasses

    import pytest

    import memreader.cli
    from memreader.core.errors import MissingInput

    score = memreader.cli.stage("score")

    for bug in (KeyError("scenarios"), FileNotFoundError(2, "No such file", "/tmp/scratch/part-0")):
        def broken(*_a, _bug=bug, **_k):
            raise _bug

        monkeypatch.setattr(memreader.cli, "stage", lambda name, _run=broken: dataclasses.replace(score, run=_run))
        with pytest.raises(type(bug)):
            main(["score", "--set", "pred=p.jsonl", "--set", "ref=r.jsonl"])

    def missing(*_a, **_k):
        raise MissingInput("memories: x.jsonl does not exist", "run `memreader read` first")

    monkeypatch.setattr(memreader.cli, "stage", lambda name: dataclasses.replace(score, run=missing))
    assert main(["score", "--set", "pred=p.jsonl", "--set", "ref=r.jsonl"]) == 2
    assert "memreader score: error: memories: x.jsonl does not exist — fix: run `memreader read` first" in capsys.readouterr().err


def test_verbose_flag_lets_the_engines_speak_in_this_process_and_its_children(monkeypatch, capsys) -> None:
    """`-v` sets MEMREADER_VERBOSE, which core.engines.engine_logging reads before vLLM configures its logging."""
    from memreader.core.engines import VERBOSE_ENV

    monkeypatch.setenv(VERBOSE_ENV, "0")  # restored after the test, whatever main sets
    assert main(["no-such-command"]) == 2 and os.environ[VERBOSE_ENV] == "0"
    assert main(["-v", "no-such-command"]) == 2 and os.environ[VERBOSE_ENV] == "1"
    assert "unknown command 'no-such-command'" in capsys.readouterr().err
