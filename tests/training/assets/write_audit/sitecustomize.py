"""Test-only file audit for the processes of a multi-process training run, kept out of the product:
tests/training/test_multiprocess.py puts this folder on the launch's ``PYTHONPATH``, so Python imports this file when
each process starts.

``MEMREADER_TEST_FILE_AUDIT=<folder>``: every process that torchrun started (``RANK`` is set; the launcher is left
alone) appends one JSON line per file it opens, renames or saves under ``$MEMREADER_HOME`` to
``<folder>/rank<RANK>-<pid>.jsonl``: ``{"rank", "op": "write" | "read", "how", "path"}`` (a rename adds ``"src"``).
Python's audit hooks see ``open`` and ``os.rename``/``os.replace``; ``torch.save`` and safetensors' ``save_file`` write
from C++ and Rust, which raise no audit event, so they are wrapped as soon as their modules are imported. Each line
is flushed when written, so a killed process leaves its record up to the kill. At a normal exit each process adds
``{"rank", "op": "exit", "group_open": bool}``: whether its torch.distributed process group was still open (left to
the interpreter's teardown, a gloo group can abort the process).
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import json
import os
import sys
from typing import Any

AUDIT_ENV = "MEMREADER_TEST_FILE_AUDIT"
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_PATHS = (str, bytes, os.PathLike)


class _Audit:
    def __init__(self, folder: str, rank: int, root: str) -> None:
        self.rank, self.root = rank, os.path.join(os.path.abspath(root), "")
        path = os.path.join(folder, f"rank{rank}-{os.getpid()}.jsonl")
        self.log = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (open for the process's life)

    def record(self, op: str, how: str, path: Any, **extra: str) -> None:
        path = os.path.abspath(os.fsdecode(path))
        if path.startswith(self.root):
            self.log.write(json.dumps({"rank": self.rank, "op": op, "how": how, "path": path, **extra}) + "\n")

    def at_exit(self) -> None:
        dist = sys.modules.get("torch.distributed")
        group_open = bool(dist is not None and dist.is_available() and dist.is_initialized())
        self.log.write(json.dumps({"rank": self.rank, "op": "exit", "group_open": group_open}) + "\n")

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if event == "open" and isinstance(args[0], _PATHS):
            _, mode, flags = args
            write = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(flags & _WRITE_FLAGS)
            self.record("write" if write else "read", "open", args[0])
        elif event == "os.rename" and isinstance(args[1], _PATHS):
            self.record("write", "rename", args[1], src=os.path.abspath(os.fsdecode(args[0])))

    def wrap_save(self, module: Any, name: str, how: str) -> None:
        save = getattr(module, name)

        def saving(obj: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(target, _PATHS):
                self.record("write", how, target)
            return save(obj, target, *args, **kwargs)

        setattr(module, name, saving)


class _WrapAfterImport(importlib.abc.MetaPathFinder):
    """Wraps ``<module>.save`` right after the module executes, before anyone imports the name from it. A module
    stays listed until it executes: libraries probe with ``importlib.util.find_spec`` before they import."""

    def __init__(self, audit: _Audit, wraps: dict[str, tuple[str, str]]) -> None:
        self.audit, self.wraps = audit, wraps

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.wraps:
            return None
        attribute, how = self.wraps[name]
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            self.wraps.pop(name)
            self.audit.wrap_save(module, attribute, how)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get(AUDIT_ENV) and os.environ.get("RANK") and os.environ.get("MEMREADER_HOME"):
    _AUDIT = _Audit(os.environ[AUDIT_ENV], int(os.environ["RANK"]), os.environ["MEMREADER_HOME"])
    sys.addaudithook(_AUDIT.hook)
    atexit.register(_AUDIT.at_exit)
    sys.meta_path.insert(0, _WrapAfterImport(_AUDIT, {"torch": ("save", "torch.save"),
                                                      "safetensors.torch": ("save_file", "safetensors")}))
