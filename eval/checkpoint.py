"""A portable checkpoint of a long evaluation: what it cost hours to make, as plain files that can be committed.

    memreader checkpoint save    results/eval-multifieldqa-zh --config configs/eval/multifieldqa_zh.yaml
    memreader checkpoint restore results/eval-multifieldqa-zh --config configs/eval/multifieldqa_zh.yaml

:func:`save` copies each method's run files and the model chunkers' shared cache (not the index) with a
``MANIFEST.json`` of sizes and SHA-256; :func:`restore` checks them, then copies back without overwriting. Folders
are resolved from the same eval config and ``--set`` overrides as the run: restore before resuming the same
``memreader eval`` command, save (and commit) while it runs or after it stopped.
Details: docs/EVALUATION.md (Checkpoints of a long run).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from memreader.core.errors import MemReaderError
from memreader.core.paths import memreader_home, sha256_file, write_json
from memreader.core.stage import Stage
from memreader.eval.qa import QAConfig, chunk_cache_dir

MANIFEST = "MANIFEST.json"
SKIPPED_DIRS = {"work", "__pycache__"}  # a method's chunker scratch folder: remade from the memories' inputs
SKIPPED_PREFIXES = ("index.",)  # index.db (Milvus Lite) and index.json (its manifest): rebuilt when needed
SKIPPED_SUFFIXES = (".lock", ".tmp", ".saving")
MAX_FILE_MB = 50.0  # one file larger than this is refused by name, not copied silently into a git folder


class CheckpointError(MemReaderError, ValueError):
    """A checkpoint that cannot be saved or restored as asked."""


@dataclass
class CheckpointReport:
    """What one save or restore did, file by file (paths relative to the checkpoint folder)."""

    copied: list[str] = field(default_factory=list)
    same: list[str] = field(default_factory=list)  # already identical where they were going
    kept: list[str] = field(default_factory=list)  # restore only: present there with other content, not touched
    bytes_copied: int = 0

    def line(self, verb: str) -> str:
        kept = f", {len(self.kept)} kept as they were (they differ: {', '.join(self.kept[:5])})" if self.kept else ""
        return (f"{verb}: {len(self.copied)} file(s) copied ({self.bytes_copied / 1e6:.1f} MB), "
                f"{len(self.same)} already the same{kept}")


def _files(root: Path) -> list[Path]:
    """The files under ``root`` a checkpoint keeps, relative to it, sorted."""
    if not root.is_dir():
        return []
    rels = (p.relative_to(root) for p in root.rglob("*") if p.is_file())
    return sorted(rel for rel in rels if not any(part in SKIPPED_DIRS for part in rel.parts[:-1])
                  and not any(part.startswith(SKIPPED_PREFIXES) for part in rel.parts)  # index.db may be a folder
                  and not rel.name.endswith(SKIPPED_SUFFIXES))


def _sources(eval_dir: Path, cache_dir: Path | None) -> dict[str, Path]:
    """Checkpoint-relative name → the file it is a copy of."""
    out = {f"run/methods/{rel.as_posix()}": eval_dir / "methods" / rel for rel in _files(eval_dir / "methods")}
    if cache_dir is not None:
        out.update({f"cache/{cache_dir.name}/{rel.as_posix()}": cache_dir / rel for rel in _files(cache_dir)})
    return out


def save(eval_dir: Path, dest: Path, cache_dir: Path | None = None, max_file_mb: float = MAX_FILE_MB
         ) -> CheckpointReport:
    """Copy the resumable outputs of the evaluation in ``eval_dir`` (``$MEMREADER_HOME/runs/<run>/eval``) and the
    chunk cache ``cache_dir`` into ``dest``; files of an earlier save that the run no longer has are removed."""
    eval_dir, dest = Path(eval_dir), Path(dest)
    if not (eval_dir / "methods").is_dir():
        raise CheckpointError(f"{eval_dir} has no methods/ folder: nothing of an evaluation to save (give the run "
                              "name that `memreader eval` used, with the same MEMREADER_HOME)")
    sources = _sources(eval_dir, cache_dir if cache_dir is not None and cache_dir.is_dir() else None)
    too_big = [f"{rel} ({src.stat().st_size / 1e6:.1f} MB)" for rel, src in sources.items()
               if src.stat().st_size > max_file_mb * 1e6]
    if too_big:
        raise CheckpointError(f"file(s) over {max_file_mb:g} MB: {', '.join(too_big)}; nothing was saved",
                              "raise max_file_mb if the checkpoint folder can hold them (a git folder should not)")
    report, manifest = CheckpointReport(), {}
    for rel, src in sources.items():
        # copied first and hashed as copied: a running evaluation may append to src meanwhile, and the manifest
        # must describe the file the checkpoint holds
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = target.with_name(target.name + ".saving")
        shutil.copy2(src, staged)
        digest, size = sha256_file(staged), staged.stat().st_size
        manifest[rel] = {"bytes": size, "sha256": digest}
        if target.is_file() and sha256_file(target) == digest:
            staged.unlink()
            report.same.append(rel)
            continue
        staged.replace(target)
        report.copied.append(rel)
        report.bytes_copied += size
    for stale in [p for p in _files(dest) if p.as_posix() != MANIFEST and p.as_posix() not in manifest]:
        (dest / stale).unlink()
    write_json(dest / MANIFEST, {"saved": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "eval_dir": str(eval_dir),
                                 "cache_dir": str(cache_dir) if cache_dir is not None else None, "files": manifest})
    return report


def restore(src: Path, eval_dir: Path, cache_root: Path) -> CheckpointReport:
    """Copy a checkpoint saved by :func:`save` back: methods into ``eval_dir``, the chunk cache folder into
    ``cache_root`` (``$MEMREADER_HOME/cache/chunkers``). Never overwrites; every file is checked against the
    manifest before the first copy."""
    src = Path(src)
    if not (src / MANIFEST).is_file():
        raise CheckpointError(f"{src} has no {MANIFEST}: not a checkpoint written by `memreader checkpoint save`")
    files = json.loads((src / MANIFEST).read_text(encoding="utf-8"))["files"]
    bad = [rel for rel, meta in files.items() if not (src / rel).is_file() or sha256_file(src / rel) != meta["sha256"]]
    if bad:
        raise CheckpointError(f"{len(bad)} file(s) of {src} are missing or differ from its manifest "
                              f"({', '.join(bad[:5])}); nothing was restored",
                              "check out the checkpoint folder again (git checkout -- <folder>)")
    report = CheckpointReport()
    for rel in sorted(files):
        head, _, rest = rel.partition("/")
        target = (Path(eval_dir) if head == "run" else Path(cache_root)) / rest
        if target.is_file():
            (report.same if sha256_file(target) == files[rel]["sha256"] else report.kept).append(rel)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, target)
        report.copied.append(rel)
        report.bytes_copied += files[rel]["bytes"]
    return report


def _run_stage(cfg: QAConfig, args: argparse.Namespace) -> int:
    """``memreader checkpoint save|restore FOLDER``: the run folder and chunk cache of the eval config ``cfg``."""
    eval_dir = memreader_home() / "runs" / cfg.run / "eval"
    found = chunk_cache_dir(cfg, cfg.dataset, str(cfg.qa))  # as `memreader eval` names it (eval.qa.run_qa)
    cache = Path(found) if found else None
    if args.action == "save":
        print(save(eval_dir, args.folder, cache, args.max_file_mb).line(f"saved {eval_dir} and {cache} to {args.folder}"))
        return 0
    report = restore(args.folder, eval_dir, cache.parent if cache is not None else memreader_home() / "cache" / "chunkers")
    others = sorted({rel.split("/")[1] for rel in report.copied + report.same + report.kept if rel.startswith("cache/")}
                    - {cache.name if cache is not None else ""})
    if others:
        print(f"WARNING: the checkpoint's chunk cache {', '.join(others)} is not the one this config uses ({cache}): the "
              "data set file or chunk_cache differs, so the model chunkers read again", file=sys.stderr)
    print(report.line(f"restored {args.folder} into {eval_dir}"))
    return 0


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["save", "restore"], help="save the run into FOLDER, or restore it from there")
    parser.add_argument("folder", type=Path, help="the checkpoint folder (e.g. results/<run>)")
    parser.add_argument("--max-file-mb", type=float, default=MAX_FILE_MB, help="save: refuse any larger file")


STAGE = Stage("checkpoint", "save or restore a portable checkpoint of a long `memreader eval` run (--config: the "
              "eval config it used)", run=_run_stage, config=QAConfig, arguments=_arguments, needs_args=True,
              example_dir="configs/eval/", epilog="--config and --set: the eval config and overrides of the run "
              "(memreader eval --help lists its keys)")

if __name__ == "__main__":
    from memreader.cli import module_main

    raise SystemExit(module_main("checkpoint"))
