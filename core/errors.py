"""The project's own error type: every user error says what is wrong and how to fix it.

The CLI prints ``memreader <cmd>: error: <what> — <fix>`` for these and exits with code 2 (``-v``
shows the traceback). Error classes of the stages derive from :class:`MemReaderError` as well as
from the built-in type they always were (``ValueError``, ``RuntimeError``), so callers that catch
those keep working.
"""

from __future__ import annotations


class MemReaderError(Exception):
    """A problem with the user's input, config, files or environment (exit code 2)."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        super().__init__(f"{problem} — fix: {fix}" if fix else problem)
        self.problem, self.fix = problem, fix


class RunFailed(MemReaderError):
    """Every item of a run failed (exit code 1): the run did nothing useful."""


class MissingInput(MemReaderError, FileNotFoundError):
    """A file or folder the user named (or an earlier stage should have written) is not there."""


class ConfigError(MemReaderError, ValueError):
    """A config file or override is wrong; the message lists every problem (re-exported by
    :mod:`memreader.core.config`)."""
