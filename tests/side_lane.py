"""The side lane: modules whose time is waiting on another process (a server starting, restarting after a kill)
run in a second pytest process beside the main one, so their waits overlap the main process's computing.

Only modules that wait far more than they compute belong here: the Milvus server module waits ~80 of its ~100 s
(server starts, kills and restarts; docs/TESTING.md "The side lane"). `vllm serve`'s test was tried here too and
did not pay: at one thread, beside the main run, it took ~136 s and the suite was 20 s slower, not faster. The
lane's process runs torch on one thread (``OMP_NUM_THREADS=1``) so that it never holds an OpenMP team beside the
main process's two threads (two teams on two cores slowed every model step several times over: docs/TESTING.md
"Why one process").

The lane starts only when a run selects its modules *and* other tests (``pytest tests/retrieval/test_milvus_server.py``
runs in this process as usual), never under ``--collect-only``, and not with ``MEMREADER_TEST_SIDE_LANE=0``. Its
tests are taken out of the main run at collection; at the end the main run waits for the lane, prints its summary
line (its whole output when it failed) and fails when the lane failed. It shares the main run's converted models
(``MEMREADER_MODELS``; converting holds a file lock, so the two processes convert once).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SIDE_LANE_MODULES = ("tests/retrieval/test_milvus_server.py",)
SWITCH_ENV = "MEMREADER_TEST_SIDE_LANE"  # "0": every test in the main process; "a.py,b.py": these modules instead
IN_LANE_ENV = "MEMREADER_TEST_IN_SIDE_LANE"  # set in the lane's own process
WAIT_S = 1200

_lane: dict[str, object] = {}


def lane_modules() -> tuple[str, ...]:
    chosen = os.environ.get(SWITCH_ENV, "").strip()
    return tuple(m.strip() for m in chosen.split(",") if m.strip()) if chosen not in ("", "0", "1") else \
        SIDE_LANE_MODULES


def _in_lane_module(item: pytest.Item) -> bool:
    return item.nodeid.split("::", 1)[0] in lane_modules()


@pytest.hookimpl(trylast=True)  # after -m / -k have deselected: the lane takes only what this run selected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(SWITCH_ENV) == "0" or os.environ.get(IN_LANE_ENV) or config.option.collectonly:
        return
    lane = [item for item in items if _in_lane_module(item)]
    if not lane or len(lane) == len(items):
        return
    base = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    log = base / "side_lane.log"
    env = {**os.environ, IN_LANE_ENV: "1", "OMP_NUM_THREADS": "1",
           # the main run's models folder (tests/conftest.py memreader_home): converted once for both processes
           "MEMREADER_MODELS": str(base / "memreader_home" / "models")}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", "--basetemp",
               str(base / "side_lane"), *[item.nodeid for item in lane]]
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=config.rootpath)
    _lane.update(proc=proc, log=log, count=len(lane),
                 modules=sorted({item.nodeid.split("::", 1)[0] for item in lane}))
    items[:] = [item for item in items if not _in_lane_module(item)]
    config.hook.pytest_deselected(items=lane)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    proc = _lane.get("proc")
    if not isinstance(proc, subprocess.Popen):
        return
    try:
        code = proc.wait(timeout=0 if exitstatus == pytest.ExitCode.INTERRUPTED else WAIT_S)
    except subprocess.TimeoutExpired:
        code = _stop(proc)
        _lane["timed_out"] = exitstatus != pytest.ExitCode.INTERRUPTED
    _lane["code"] = code
    if code != 0 and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _stop(proc: subprocess.Popen) -> int:
    """Interrupt the lane as Ctrl-C would, so its fixtures stop what they started (a server in its own process
    group outlives a killed pytest); SIGKILL if it has not ended a minute later."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # noqa: ANN001
    if "code" not in _lane:
        return
    text = Path(str(_lane["log"])).read_text(encoding="utf-8", errors="replace")
    last = next((line for line in reversed(text.splitlines()) if line.strip()), "(no output)")
    title = (f"side lane: {_lane['count']} tests of {', '.join(_lane['modules'])} in their own pytest process "
             "beside this one")
    terminalreporter.write_sep("=", title)
    if _lane["code"] != 0:
        why = f"stopped after {WAIT_S} s" if _lane.get("timed_out") else f"exit code {_lane['code']}"
        terminalreporter.write_line(f"side lane FAILED ({why}); its output ({_lane['log']}):")
        terminalreporter.write_line(text[-20000:])
    terminalreporter.write_line(f"side lane: {last.strip(' =')}")
