"""The cost ledger: phase seconds add up across sessions, and the peak memory counts child processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from memreader.eval.costs import CostLedger, PeakMemory


def test_phases_add_up_across_sessions_and_survive_a_crash(tmp_path) -> None:
    path = tmp_path / "cost.json"
    try:
        with CostLedger(path) as cost, cost.phase("answers"):
            time.sleep(0.05)
            raise RuntimeError("crashed mid-answering")
    except RuntimeError:
        pass
    first = json.loads(path.read_text())
    assert first["sessions"] == 1 and first["phases"]["answers"] >= 0.05
    with CostLedger(path) as cost, cost.phase("answers"):
        time.sleep(0.05)
    second = json.loads(path.read_text())
    assert second["sessions"] == 2 and second["phases"]["answers"] >= first["phases"]["answers"] + 0.05
    assert second["seconds"] == round(sum(second["phases"].values()), 1)


@pytest.mark.heavy
def test_peak_memory_counts_a_child_process() -> None:
    alone = PeakMemory().start()
    base = alone.stop()
    # a child that holds ~300 MiB for a moment: the tree's peak must see it
    child = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(300 * 2**20); b[::4096] = "
                              "b'x' * len(b[::4096]); print('ready', flush=True); time.sleep(3)"],
                             stdout=subprocess.PIPE, text=True)
    meter = PeakMemory(interval=0.1).start()
    assert child.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    peak = meter.stop()
    child.wait()
    assert meter.source == "proc-tree"
    assert peak >= base + 250, (base, peak)


@pytest.mark.heavy
def test_a_killed_session_keeps_the_time_it_spent(tmp_path, monkeypatch) -> None:
    import memreader.eval.costs as costs

    monkeypatch.setattr(costs, "SAVE_EVERY", 0.1)
    path = tmp_path / "cost.json"
    # a child process that enters the answers phase and is then killed (no cleanup runs)
    code = ("import time, memreader.eval.costs as c; c.SAVE_EVERY = 0.1\n"
            f"ledger = c.CostLedger(__import__('pathlib').Path({str(path)!r})).__enter__()\n"
            "with ledger.phase('answers'):\n    print('in', flush=True); time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "in"
    time.sleep(1.5)
    child.kill()
    child.wait()
    assert json.loads(path.read_text())["phases"]["answers"] >= 1.0


def test_periodic_saves_do_not_count_a_phase_twice(tmp_path, monkeypatch) -> None:
    import memreader.eval.costs as costs

    monkeypatch.setattr(costs, "SAVE_EVERY", 0.1)
    path = tmp_path / "cost.json"
    ledger = CostLedger(path)
    ledger.memory.interval = 0.05
    with ledger, ledger.phase("answers"):
        time.sleep(1.0)
    seconds = json.loads(path.read_text())["phases"]["answers"]
    assert 1.0 <= seconds < 1.5, seconds  # not the periodic value plus the whole phase again


def test_a_session_that_only_reuses_does_not_count(tmp_path) -> None:
    path = tmp_path / "cost.json"
    with CostLedger(path) as cost, cost.phase("answers"):
        time.sleep(0.02)
    first = json.loads(path.read_text())
    assert first["sessions"] == 1
    with CostLedger(path) as cost:  # a resumed run that finds everything done: no phase runs
        blob = bytearray(64 * 2**20)  # a peak that belongs to nothing this method did
        time.sleep(0.6)
        del blob
        assert cost.sessions == 1
    assert json.loads(path.read_text()) == first
    with CostLedger(path) as cost, cost.phase("clarity"):
        pass
    assert json.loads(path.read_text())["sessions"] == 2
