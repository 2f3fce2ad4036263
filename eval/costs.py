"""What each method of an evaluation costs: wall time per phase and peak memory, kept across resumed sessions.

    {"phases": {"memories": 812.4, "index": 95.1, "answers": 3120.7, "clarity": 640.2},
     "sessions": 3, "peak_rss_mib": 6120.5, "rss_source": "proc-tree"}           # methods/<m>/cost.json

``peak_rss_mib`` sums this process tree's resident memory from ``/proc`` (an upper bound: shared pages count once per
process); without ``/proc`` it is this process's ``getrusage`` peak and ``rss_source`` says ``getrusage-self``.
Details: docs/EVALUATION.md (Cost per method).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from memreader.core.paths import write_json

SAVE_EVERY = 30.0
"""Seconds between writes of the ledger during a phase."""
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _proc_tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants (one scan of /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:  # the process ended between the listing and the read
            continue
        # the command name may hold spaces and parentheses: the fields start after the last ')'
        fields = stat[stat.rindex(b")") + 2:].split()
        pid = int(entry.name)
        children.setdefault(int(fields[1]), []).append(pid)
        rss[pid] = int(fields[21]) * PAGE_BYTES
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total


class PeakMemory:
    """Samples the resident memory of this process tree in a background thread; ``peak_mib`` after ``stop``."""

    def __init__(self, interval: float = 0.5, on_sample: Any = None) -> None:
        self.interval, self.on_sample = interval, on_sample
        self.source = "proc-tree" if sys.platform.startswith("linux") and os.path.isdir("/proc") else "getrusage-self"
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> int:
        if self.source == "proc-tree":
            value = _proc_tree_rss(os.getpid())
        else:  # ru_maxrss: kilobytes on Linux, bytes on macOS
            value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        self.peak_bytes = max(self.peak_bytes, value)
        return value

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()
            if self.on_sample is not None:
                self.on_sample()

    def start(self) -> PeakMemory:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="peak-memory", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> float:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        return self.peak_mib

    @property
    def peak_mib(self) -> float:
        return round(self.peak_bytes / 2**20, 1)


class CostLedger:
    """``cost.json`` of one method: phase seconds summed over sessions, the largest peak memory seen."""

    def __init__(self, path: Path) -> None:
        self.path = path
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        self.phases: dict[str, float] = {k: float(v) for k, v in data.get("phases", {}).items()}
        self._earlier_sessions = int(data.get("sessions", 0))
        self._worked = False  # a session counts (and its memory peak with it) once a phase runs in it
        self.peak_rss_mib = float(data.get("peak_rss_mib", 0.0))
        self.rss_source = str(data.get("rss_source", ""))
        self.memory = PeakMemory(on_sample=self._tick)
        self._lock = threading.RLock()
        self._running: tuple[str, float, float] | None = None  # phase, its start, its seconds before this session
        self._last_save = time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time one phase. The ledger is written after it and every :data:`SAVE_EVERY` seconds during it, so a
        session that is killed mid-phase loses at most that much of its time."""
        t0 = time.perf_counter()
        with self._lock:
            self._worked = True
            before = self.phases.get(name, 0.0)  # the periodic saves overwrite phases[name] from this base
            self._running = (name, t0, before)
        try:
            yield
        finally:
            with self._lock:
                self._running = None
                self.phases[name] = round(before + time.perf_counter() - t0, 1)
            self.save()

    def _tick(self) -> None:
        now = time.perf_counter()
        with self._lock:
            if self._running is None or now - self._last_save < SAVE_EVERY:
                return
            name, t0, before = self._running
            self.phases[name] = round(before + now - t0, 1)
        self.save()

    @property
    def sessions(self) -> int:
        """Sessions that worked on the method: a resumed run that only reuses what is done does not count."""
        return self._earlier_sessions + int(self._worked)

    def __enter__(self) -> CostLedger:
        self.memory.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.memory.stop()
        self.save()

    def save(self) -> None:
        with self._lock:  # the sampler thread and the main thread both save: one writer at a time
            self._last_save = time.perf_counter()
            if not self._worked:  # a run that only reused what is done leaves the ledger as it was
                return
            self.peak_rss_mib = max(self.peak_rss_mib, self.memory.peak_mib)
            # a mix of sources is named as such: the numbers are not the same measure
            self.rss_source = self.memory.source if self.rss_source in ("", self.memory.source) else "mixed"
            write_json(self.path, self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"phases": dict(self.phases), "seconds": round(sum(self.phases.values()), 1),
                    "sessions": self.sessions, "peak_rss_mib": self.peak_rss_mib, "rss_source": self.rss_source}
