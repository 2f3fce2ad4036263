"""The ``vllm_dp`` engine of :mod:`memreader.inference.distributed`: data parallelism on one node, no Ray.

``data_parallel_size`` processes (``python -m memreader.inference.dp_worker JOB``), each on its own GPU(s), read the
shards dealt round-robin; a dead process is restarted for its unfinished shards, an exception inside one is a result.
Details: docs/DISTRIBUTED_READING.md (One node, several GPUs; Failures).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from memreader.core.errors import MemReaderError
from memreader.inference.shards import Shard, ShardError, ShardStore
from memreader.inference.workers import worker_env, workers_died

log = logging.getLogger(__name__)


def process_gpus(cfg: Any) -> list[list[str]]:
    """The GPU ids of each engine process (empty lists: processes on CPU, backend=transformers)."""
    per = int(cfg.worker_gpus())
    if per == 0:
        if cfg.data_parallel_size < 1:
            raise MemReaderError("engine=vllm_dp on CPU (gpus_per_worker=0) needs data_parallel_size >= 1",
                                 "set data_parallel_size to the number of worker processes")
        return [[] for _ in range(cfg.data_parallel_size)]
    given = os.environ.get("CUDA_VISIBLE_DEVICES")  # as given, else every device torch sees
    if given is None:
        import torch

        given = ",".join(str(i) for i in range(torch.cuda.device_count()))
    gpus = [g.strip() for g in given.split(",") if g.strip()]
    n = cfg.data_parallel_size or len(gpus) // per
    if n < 1 or n * per > len(gpus):
        raise MemReaderError(f"engine=vllm_dp needs {max(n, 1) * per} GPU(s) ({max(n, 1)} process(es) x {per}) but this "
                             f"node shows {len(gpus)} ({', '.join(gpus) or 'none'})",
                             "lower data_parallel_size or gpus_per_worker, check CUDA_VISIBLE_DEVICES, or use "
                             "engine=ray for several nodes")
    return [gpus[r * per:(r + 1) * per] for r in range(n)]


def run_data_parallel(cfg: Any, todo: list[Shard], out_dir: Path, key: str) -> dict[int, dict[str, Any]]:
    """Read ``todo`` with one process per GPU group; shard index → its marker (or ``{"error": ...}``)."""
    groups = process_gpus(cfg)[:len(todo)]  # no idle process
    jobs = ShardStore(out_dir).dir / ".dp-jobs"
    shutil.rmtree(jobs, ignore_errors=True)
    jobs.mkdir(parents=True)
    print(f"read-dist: {len(groups)} engine process(es) on this node"
          + (f", GPUs {' | '.join(','.join(g) for g in groups)}" if groups[0] else " (CPU)") + f", {len(todo)} shard(s)")
    deaths = {s.index: 0 for s in todo}
    results: dict[int, dict[str, Any]] = {}
    procs: dict[int, tuple[subprocess.Popen, list[Shard], Path]] = {}
    spawned = 0

    def start(rank: int, shards: list[Shard]) -> None:
        nonlocal spawned
        spawned += 1
        job = jobs / f"worker-{rank}-{spawned}.json"
        out = job.with_suffix(".results.jsonl")
        job.write_text(json.dumps({"config": asdict(cfg), "out_dir": str(out_dir), "key": key, "results": str(out),
                                   "shards": [{"index": s.index, "docs": s.payload()} for s in shards]}),
                       encoding="utf-8")
        env = {**os.environ, **worker_env()}
        if groups[rank]:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(groups[rank])
        else:  # its share of the cores, as Ray gives an actor: vLLM's CPU engine would take every core in each process
            env["OMP_NUM_THREADS"] = str(max(1, int(cfg.cpus_per_worker)))
        procs[rank] = (subprocess.Popen([sys.executable, "-m", "memreader.inference.dp_worker", str(job)],
                                        env=env), shards, out)

    try:
        for rank in range(len(groups)):
            start(rank, todo[rank::len(groups)])
        exhausted: list[str] = []
        last_code = 0
        while procs:
            time.sleep(0.2)
            for rank, (proc, shards, out) in list(procs.items()):
                code = proc.poll()
                if code is None:
                    continue
                del procs[rank]
                if out.is_file():  # a line cut short by a death is not a result: that shard is redone
                    for line in out.read_text(encoding="utf-8").splitlines(keepends=True):
                        if line.endswith("\n"):
                            row = json.loads(line)
                            results[row["shard"]] = row
                left = [s for s in shards if s.index not in results]
                if not left:
                    continue
                if code == 0:
                    raise ShardError(f"engine process {rank} exited without reading {', '.join(s.name for s in left)}",
                                     "rerun the same command; finished shards are kept")
                last_code = code
                for s in left:
                    deaths[s.index] += 1
                retry = [s for s in left if deaths[s.index] <= cfg.max_retries]
                exhausted += [s.name for s in left if deaths[s.index] > cfg.max_retries]
                log.warning("read-dist: engine process %d (pid %d) died with exit code %s in the middle of %s; "
                            "%d shard(s) will be read again from scratch", rank, proc.pid, code, left[0].name,
                            len(retry))
                if retry:
                    start(rank, retry)
        if exhausted:
            raise workers_died(cfg, todo, out_dir, key, f"the engine process exited with code {last_code}")
    finally:
        for proc, _, _ in procs.values():  # an error or Ctrl-C in the driver: stop the others
            proc.terminate()
        for proc, _, _ in procs.values():
            proc.wait()
    shutil.rmtree(jobs)
    return results
