"""One way to define a stage: each stage module exports ``STAGE = Stage(...)``; ``memreader.cli`` is built from them.

    STAGE = Stage("read", "MemReader batch reading of a corpus (resumable)", run=read_corpus_memories,
                  config=ReadConfig, example_dir="configs/inference/")
    STAGE = Stage("merge", "...", run=merge, config=MergeConfig, flags=(Flag("adapter"), Flag("overwrite", const=True)))

Details (precedence of flags and ``--set``, ``python -m <stage module>``): docs/ARCHITECTURE.md (One way to define a
stage).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Flag", "PrintAction", "Stage"]


@dataclass(frozen=True)
class Flag:
    """A shortcut for a config key: ``--key VALUE`` (or ``positional``: a bare argument) is ``--set key=VALUE``;
    with ``const`` it takes no value and sets the key to ``const`` (``--overwrite`` → ``overwrite=true``)."""

    key: str
    type: Callable[[str], Any] = str
    const: Any = None
    name: str = ""
    """The flag as typed (default ``--`` + the key with ``-`` for ``_``)."""
    positional: bool = False
    many: bool = False
    """Takes several values (a list key)."""
    help: str = ""

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        what = self.help or f"same as --set {self.key}={'VALUE' if self.const is None else json.dumps(self.const)}"
        nargs = "*" if self.many else "?"
        if self.positional:
            parser.add_argument(self.key, metavar=self.key.upper(), type=self.type, nargs=nargs, default=None, help=what)
        elif self.const is not None:
            parser.add_argument(self.name or f"--{self.key.replace('_', '-')}", dest=self.key, action="store_const",
                                const=self.const, default=None, help=what)
        else:
            parser.add_argument(self.name or f"--{self.key.replace('_', '-')}", dest=self.key, type=self.type,
                                nargs="+" if self.many else None, default=None, help=what)


class PrintAction(argparse.Action):
    """A flag that prints ``text()`` and exits 0, like ``--help`` (``train --list-keys``)."""

    def __init__(self, option_strings: list[str], dest: str, text: Callable[[], str], help: str = "") -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)
        self.text = text

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: Any = None) -> None:
        print(self.text())
        parser.exit(0)


@dataclass(frozen=True)
class Stage:
    """A ``memreader`` subcommand (see the module docstring)."""

    name: str
    help: str
    run: Callable[..., Any]
    """``run(cfg)`` (``run(cfg, args)`` with ``needs_args``); an int result is the exit code, anything else is 0."""
    config: type | None = None
    example_dir: str = "configs/"
    flags: tuple[Flag, ...] = ()
    arguments: Callable[[argparse.ArgumentParser], None] | None = None
    """Arguments that are not config keys (a question to ask, ``--json``)."""
    load: Callable[[str | None, list[str]], Any] | None = None
    """How to build the config from ``(--config path, overrides)`` when it is not ``load_config(config, ...)``."""
    epilog: str = ""
    """``--help``'s closing text; default: every key of ``config`` with its help."""
    needs_args: bool = False
    """``run`` also takes the parsed arguments (for the extra ``arguments``)."""
    models: Callable[[Any], dict[str, str]] | None = None
    """The models a run of the config loads on this machine, by config key (not those an HTTP server runs):
    :func:`memreader.core.registry.check_models` names any that cannot load before ``run`` starts."""

    def parser(self, description: str | None = None) -> argparse.ArgumentParser:
        """The stage's argument parser: ``--config``, ``--set``, the shortcut flags and the extra arguments."""
        from memreader.core.config import add_config_arguments, describe_config

        epilog = self.epilog or (describe_config(self.config) if self.config is not None else None)
        parser = argparse.ArgumentParser(prog=f"memreader {self.name}", description=description or self.help,
                                         epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
        add_config_arguments(parser, self.example_dir)
        for flag in self.flags:
            flag.add_to(parser)
        if self.arguments is not None:
            self.arguments(parser)
        return parser

    def overrides(self, args: argparse.Namespace) -> list[str]:
        """The shortcut flags given, as ``key=value`` overrides, then ``--set`` (so ``--set`` wins)."""
        from memreader.core.config import shortcut_overrides

        return shortcut_overrides(args, [f.key for f in self.flags]) + list(args.set)

    def configure(self, args: argparse.Namespace) -> Any:
        """The config of parsed arguments (None for a stage without one)."""
        if self.load is not None:
            return self.load(args.config, self.overrides(args))
        if self.config is None:
            return None
        from memreader.core.config import load_config

        return load_config(self.config, args.config, self.overrides(args))

    def __call__(self, args: argparse.Namespace) -> int:
        """Build the config and run; returns the exit code."""
        cfg = self.configure(args)
        if self.models is not None:
            from memreader.core.registry import check_models

            check_models(self.models(cfg))
        result = self.run(cfg, args) if self.needs_args else self.run(cfg)
        return result if isinstance(result, int) and not isinstance(result, bool) else 0
