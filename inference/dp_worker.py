"""One engine process of the ``vllm_dp`` engine (:mod:`memreader.inference.dp_engine` starts them):

    python -m memreader.inference.dp_worker JOB.json

The job file names the config, the output folder, the read key, the shards and the results file; the process
loads its backend once, reads its shards one after another and appends one result line per shard."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from memreader.inference.distributed import DistributedReadConfig
from memreader.inference.shards import Shard, read_shard
from memreader.inference.workers import describe_error, worker_backend


def worker_main(job_path: str) -> int:
    """One engine process: load the backend once, read the job's shards, one result line each."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    cfg = DistributedReadConfig(**job["config"])
    out_dir, key, results = Path(job["out_dir"]), job["key"], Path(job["results"])
    shards = [Shard.from_payload(s["index"], s["docs"]) for s in job["shards"]]

    def report(row: dict[str, Any]) -> None:
        with results.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")

    try:
        backend = worker_backend(cfg)
    except Exception as exc:  # every shard of this process reports it; the driver raises it
        error = describe_error(exc)
        for shard in shards:
            report({"shard": shard.index, "error": error})
        return 0
    for shard in shards:
        try:
            report(read_shard(cfg, shard, out_dir, backend, key))
        except Exception as exc:  # returned to the driver, which raises it naming the shard
            report({"shard": shard.index, "error": describe_error(exc)})
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m memreader.inference.dp_worker JOB.json (started by memreader read-dist engine=vllm_dp)",
              file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(worker_main(sys.argv[1]))
