"""One writer per run folder: a lock file holding the writer's PID.

    with RunLock(out_dir):
        ...write memories...

A second writer gets :class:`RunLocked` naming the holder (exit code 2); a stale lock (a killed job) is reported
and taken over. Released on exit, also on an exception.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from types import TracebackType

from memreader.core.errors import MemReaderError

log = logging.getLogger(__name__)
LOCK_NAME = ".memreader.lock"


class RunLocked(MemReaderError):
    """Another live process is writing into this run folder."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class RunLock:
    """An exclusive, PID-holding lock file in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / LOCK_NAME
        self.held = False

    def acquire(self) -> None:
        """Take the lock, or raise :class:`RunLocked` naming the live holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = f"{os.getpid()} {socket.gethostname()}\n"
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self.path.read_text(encoding="utf-8", errors="replace").split()
                pid = int(holder[0]) if holder and holder[0].isdigit() else -1
                host = holder[1] if len(holder) > 1 else "?"
                if pid > 0 and (host != socket.gethostname() or _alive(pid)):
                    raise RunLocked(f"{self.path.parent} is being written by process {pid} on {host}",
                                    "wait for it to finish, or use another run name (--set run=...)") from None
                log.warning("%s: taking over a stale lock of process %s (it no longer runs)", self.path, pid)
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(me)
            self.held = True
            return
        raise RunLocked(f"could not take the lock {self.path}", "remove the file if no memreader process runs")

    def release(self) -> None:
        """Give the lock back (only if this process holds it)."""
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
