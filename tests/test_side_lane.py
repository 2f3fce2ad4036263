"""The suite's side lane (tests/side_lane.py) on a throwaway project: the lane's module runs in a second pytest
process with one OpenMP thread while the rest runs here, a failure there fails the run and shows its output, and a
run of the lane's module alone stays in one process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.heavy  # runs pytest in subprocesses

MAIN = '''
import os
from pathlib import Path

def test_main(tmp_path):
    Path(os.environ["PIDS"], "main").write_text(str(os.getpid()))
'''
LANE = '''
import os
from pathlib import Path

def test_lane():
    Path(os.environ["PIDS"], "lane").write_text(f"{os.getpid()} {os.environ.get('OMP_NUM_THREADS')}")
    assert os.environ.get("LANE_SHOULD_FAIL") != "1", "the lane's own failure"
'''


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    (project / "pids").mkdir(parents=True)
    (project / "test_main.py").write_text(MAIN)
    (project / "test_lane.py").write_text(LANE)
    (project / "conftest.py").write_text('pytest_plugins = ["tests.side_lane"]\n')
    return project


def _pytest(project: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    # nothing of the outer run's own settings (a plugin named in PYTEST_ADDOPTS, a lane of its own)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("MEMREADER_TEST", "PYTEST_"))}
    environ.update({"PYTHONPATH": str(ROOT), "PIDS": str(project / "pids"), "MEMREADER_TEST_SIDE_LANE": "test_lane.py",
                    **env})
    environ.pop("OMP_NUM_THREADS", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(project), *args],
                          cwd=project, capture_output=True, text=True, env=environ, timeout=120)


def test_the_lane_module_runs_in_its_own_process_with_one_thread(tmp_path: Path) -> None:
    project = _project(tmp_path)
    proc = _pytest(project, "test_main.py", "test_lane.py")
    assert proc.returncode == 0, proc.stdout[-3000:]
    main_pid = (project / "pids" / "main").read_text()
    lane_pid, threads = (project / "pids" / "lane").read_text().split()
    assert lane_pid != main_pid and threads == "1"
    assert "side lane: 1 tests of test_lane.py in their own pytest process" in proc.stdout
    assert "side lane: 1 passed" in proc.stdout


def test_a_failure_in_the_lane_fails_the_run_and_shows_its_output(tmp_path: Path) -> None:
    project = _project(tmp_path)
    proc = _pytest(project, "test_main.py", "test_lane.py", LANE_SHOULD_FAIL="1")
    assert proc.returncode == 1
    assert "1 passed" in proc.stdout  # the main process's own test
    assert "side lane FAILED (exit code 1)" in proc.stdout and "the lane's own failure" in proc.stdout


def test_the_lane_module_alone_or_the_lane_switched_off_runs_here(tmp_path: Path) -> None:
    project = _project(tmp_path)
    alone = _pytest(project, "test_lane.py")
    assert alone.returncode == 0 and "side lane" not in alone.stdout
    assert (project / "pids" / "lane").read_text().split()[1] == "None"  # this process: no OMP_NUM_THREADS set
    off = _pytest(project, "test_main.py", "test_lane.py", MEMREADER_TEST_SIDE_LANE="0")
    assert off.returncode == 0 and "side lane" not in off.stdout
    assert (project / "pids" / "lane").read_text().split()[0] == (project / "pids" / "main").read_text()
