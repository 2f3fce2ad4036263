"""Portable checkpoints of a long evaluation (eval/checkpoint.py): a run saved, its machine wiped, restored and
resumed answers nothing again and builds no index; a restore never overwrites and refuses a damaged checkpoint."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import memreader.eval.method_run as method_run
import memreader.eval.qa as qa
from memreader.eval.checkpoint import MANIFEST, CheckpointError, restore, save
from tests.engine_fakes import fake_engines
from tests.eval.test_qa_harness import EchoFirstPassage, _cfg, demo_files  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[2]


class NeverAsked:
    def generate_many(self, *a, **kw):
        raise AssertionError("a restored run answered a question again")


def _fake_run(root: Path) -> tuple[Path, Path]:
    eval_dir, cache = root / "runs/r/eval", root / "cache/chunkers/set-abc"
    (eval_dir / "methods/fixed/work").mkdir(parents=True)
    (eval_dir / "methods/fixed/answers.jsonl").write_text('{"id": "q1"}\n')
    (eval_dir / "methods/fixed/cost.json").write_text("{}")
    (eval_dir / "methods/fixed/index.db").write_bytes(b"milvus")
    (eval_dir / "methods/fixed/index.json").write_text("{}")
    (eval_dir / "methods/fixed/work/corpus-2.jsonl").write_text("{}")
    (cache / "llm-direct/c178-k/read").mkdir(parents=True)
    (cache / "llm-direct/c178-k/read/memories.jsonl").write_text('{"doc_id": "a"}\n')
    return eval_dir, cache


@pytest.mark.integration
def test_a_restored_run_on_a_wiped_machine_answers_nothing_again(demo_files, monkeypatch, tmp_path) -> None:  # noqa: F811
    fake_engines(monkeypatch, EchoFirstPassage())
    first = qa.run_qa(_cfg(demo_files))
    home = Path(demo_files["home"])
    report = save(home / "runs/q/eval", tmp_path / "ckpt")
    names = json.loads((tmp_path / "ckpt" / MANIFEST).read_text())["files"]
    assert "run/methods/fixed/answers.jsonl" in names and "run/methods/memreader/memories.jsonl" in names
    assert not [n for n in names if "/index." in n], "the Milvus index is rebuilt, never checkpointed"
    assert len(report.copied) == len(names)

    shutil.rmtree(home)  # a new machine: the artifact root is gone
    got = restore(tmp_path / "ckpt", home / "runs/q/eval", home / "cache/chunkers")
    assert sorted(got.copied) == sorted(names) and not got.kept
    fake_engines(monkeypatch, NeverAsked())

    def no_index(*a, **kw):
        raise AssertionError("the index was rebuilt although every question is answered")

    monkeypatch.setattr(method_run, "_index", no_index)
    again = qa.run_qa(_cfg(demo_files))
    for m in ("memreader", "fixed"):
        assert again["methods"][m]["scores"]["metrics"] == first["methods"][m]["scores"]["metrics"]
    assert not (home / "runs/q/eval/methods/fixed/index.db").exists()


def test_save_keeps_what_is_costly_and_drops_what_is_rebuilt(tmp_path) -> None:
    eval_dir, cache = _fake_run(tmp_path / "home")
    save(eval_dir, tmp_path / "ckpt", cache)
    files = set(json.loads((tmp_path / "ckpt" / MANIFEST).read_text())["files"])
    assert files == {"run/methods/fixed/answers.jsonl", "run/methods/fixed/cost.json",
                     "cache/set-abc/llm-direct/c178-k/read/memories.jsonl"}
    # a second save after the run went on copies only what changed and drops what the run no longer has
    (eval_dir / "methods/fixed/answers.jsonl").write_text('{"id": "q1"}\n{"id": "q2"}\n')
    (eval_dir / "methods/fixed/cost.json").unlink()
    second = save(eval_dir, tmp_path / "ckpt", cache)
    assert second.copied == ["run/methods/fixed/answers.jsonl"] and len(second.same) == 1
    assert not (tmp_path / "ckpt/run/methods/fixed/cost.json").exists()


def test_restore_never_overwrites_and_names_what_it_kept(tmp_path) -> None:
    eval_dir, cache = _fake_run(tmp_path / "home")
    save(eval_dir, tmp_path / "ckpt", cache)
    other = tmp_path / "other"
    (other / "runs/r/eval/methods/fixed").mkdir(parents=True)
    newer = other / "runs/r/eval/methods/fixed/answers.jsonl"
    newer.write_text('{"id": "q1"}\n{"id": "q2"}\n')
    got = restore(tmp_path / "ckpt", other / "runs/r/eval", other / "cache/chunkers")
    assert got.kept == ["run/methods/fixed/answers.jsonl"]
    assert newer.read_text().count("\n") == 2, "the machine's newer answers are kept"
    assert (other / "cache/chunkers/set-abc/llm-direct/c178-k/read/memories.jsonl").is_file()
    assert "kept as they were" in got.line("restore")


def test_a_damaged_checkpoint_is_refused_before_any_copy(tmp_path) -> None:
    eval_dir, cache = _fake_run(tmp_path / "home")
    save(eval_dir, tmp_path / "ckpt", cache)
    (tmp_path / "ckpt/run/methods/fixed/answers.jsonl").write_text("torn")
    with pytest.raises(CheckpointError, match="differ from its manifest.*answers.jsonl"):
        restore(tmp_path / "ckpt", tmp_path / "new/eval", tmp_path / "new/cache")
    assert not (tmp_path / "new").exists()


def test_bad_input_is_named(tmp_path) -> None:
    with pytest.raises(CheckpointError, match="no methods/ folder"):
        save(tmp_path / "nothing", tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="no MANIFEST.json"):
        restore(tmp_path, tmp_path / "e", tmp_path / "c")
    eval_dir, cache = _fake_run(tmp_path / "home")
    (eval_dir / "methods/fixed/answers.jsonl").write_bytes(b"x" * 2_000_001)
    with pytest.raises(CheckpointError, match=r"over 2 MB: run/methods/fixed/answers.jsonl \(2.0 MB\)"):
        save(eval_dir, tmp_path / "ckpt", cache, max_file_mb=2)
    assert not (tmp_path / "ckpt").exists(), "a refused save writes nothing"


def _command(*args: str, home: Path) -> subprocess.CompletedProcess:
    """``memreader checkpoint ARGS`` in a subprocess, as a user runs it."""
    env = {**os.environ, "MEMREADER_HOME": str(home), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "memreader.cli", "checkpoint", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.heavy
def test_the_command_finds_the_run_and_cache_from_the_config(demo_files, tmp_path) -> None:  # noqa: F811
    home = Path(demo_files["home"])
    config = tmp_path / "eval.yaml"
    config.write_text(f"dataset: jsonl\nqa: {demo_files['qa']}\nmemories: {demo_files['memories']}\nrun: q\n")
    digest = hashlib.sha256(Path(demo_files["qa"]).read_bytes()).hexdigest()[:12]
    eval_dir, cache = home / "runs/q/eval", home / f"cache/chunkers/jsonl-{digest}"
    (eval_dir / "methods/fixed").mkdir(parents=True)
    (eval_dir / "methods/fixed/answers.jsonl").write_text('{"id": "q1"}\n')
    (cache / "lumber").mkdir(parents=True)
    (cache / "lumber/answers.jsonl").write_text("{}\n")
    saved = _command("save", str(tmp_path / "ckpt"), "--config", str(config), home=home)
    assert saved.returncode == 0, saved.stderr
    assert "2 file(s) copied" in saved.stdout
    shutil.rmtree(home)
    back = _command("restore", str(tmp_path / "ckpt"), "--config", str(config), home=home)
    assert back.returncode == 0, back.stderr
    assert (eval_dir / "methods/fixed/answers.jsonl").is_file() and (cache / "lumber/answers.jsonl").is_file()
    missing = _command("restore", "--config", str(config), home=home)
    assert missing.returncode == 2 and "required: folder" in missing.stderr
    nothing = _command("save", str(tmp_path / "c2"), "--config", str(config), "--set", "run=other", home=home)
    assert nothing.returncode == 2 and "memreader checkpoint: error:" in nothing.stderr
    assert "no methods/ folder" in nothing.stderr
    damaged = _command("restore", str(tmp_path), "--config", str(config), home=home)
    assert damaged.returncode == 2 and "not a checkpoint written by `memreader checkpoint save`" in damaged.stderr
    helped = _command("--help", home=home)
    assert helped.returncode == 0 and "{save,restore}" in helped.stdout and "--max-file-mb" in helped.stdout


def test_a_file_the_run_appends_to_during_a_save_is_recorded_as_copied(tmp_path, monkeypatch) -> None:
    import memreader.eval.checkpoint as checkpoint

    eval_dir, cache = _fake_run(tmp_path / "home")
    real_copy = shutil.copy2

    def copy_while_the_run_writes(src, dst, **kw):
        with open(src, "a") as fh:  # the evaluation appends an answer just as the file is copied
            fh.write('{"id": "late"}\n')
        return real_copy(src, dst, **kw)

    monkeypatch.setattr(checkpoint.shutil, "copy2", copy_while_the_run_writes)
    save(eval_dir, tmp_path / "ckpt", cache)
    monkeypatch.setattr(checkpoint.shutil, "copy2", real_copy)
    got = restore(tmp_path / "ckpt", tmp_path / "new/eval", tmp_path / "new/cache")
    assert "run/methods/fixed/answers.jsonl" in got.copied
