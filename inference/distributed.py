"""MemReader reading beyond one GPU (``memreader read-dist``): the corpus in shards, each read by a worker with its
own engine (``engine: ray``, Ray Data; ``engine: vllm_dp``, one node, :mod:`memreader.inference.dp_engine`), merged
into one ``memories.jsonl`` (resumable per shard, each doc_id once; :mod:`memreader.inference.shards`).

Every shard is read by :func:`memreader.inference.reader.read_documents`, the plain reader's code.
Details (launching, keys, Ray addresses, retries): docs/DISTRIBUTED_READING.md.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memreader.core.config import field
from memreader.core.errors import RunFailed
from memreader.core.paths import run_dir, write_json, write_resolved_config
from memreader.core.registry import resolve_model
from memreader.core.runlock import RunLock
from memreader.core.stage import Stage
from memreader.inference.reader import STAGE as reader_stage
from memreader.inference.reader import ReadConfig, read_key, resolved, warn_unwritten
from memreader.inference.shards import FilePlan, Shard, ShardError, ShardStore, merge_shards, plan_file_shards

log = logging.getLogger(__name__)
ENGINES = ("ray", "vllm_dp")


@dataclass
class DistributedReadConfig(ReadConfig):
    """A reading run over shards of the corpus (every :class:`ReadConfig` key applies to each shard)."""

    engine: str = field("ray", help="'ray' (Ray Data: local instance or cluster) or 'vllm_dp' (one node: one "
                        "engine process per GPU)")
    shard_size: int = field(64, ge=1, help="documents per shard (the unit of work, of resuming and of retries); "
                            "keep it when resuming a run")
    ray_address: str = field("", help="engine=ray: '' = start a local Ray instance for this run; 'auto' = the "
                             "running cluster (RAY_ADDRESS); '<head>:6379' or 'ray://<head>:10001' = that cluster")
    connect_timeout_s: float = field(10.0, gt=0, help="engine=ray: seconds to wait for ray_address to answer")
    worker_start_timeout_s: float = field(900.0, gt=0, help="engine=ray: seconds for every worker to be placed on a "
                                          "node and load its model before the first shard is dealt (then an error "
                                          "naming the shortfall)")
    ray_num_cpus: int = field(0, ge=0, help="engine=ray, local instance: CPUs it may use (0 = all)")
    num_workers: int = field(0, ge=0, help="engine=ray: workers (actors), each loading the model once; 0 = as many "
                             "as the cluster's GPUs (or, without GPUs, CPUs) allow, at most one per shard")
    cpus_per_worker: float = field(1.0, gt=0, help="CPUs per worker (also its torch threads on CPU)")
    gpus_per_worker: float | None = field(None, ge=0, help="GPUs per worker; null = 1 for backend=vllm on a "
                                          "cluster or a machine with a GPU, else 0 (vLLM's CPU build, transformers); "
                                          "above 1 = vLLM tensor parallelism inside the worker")
    data_parallel_size: int = field(0, ge=0, help="engine=vllm_dp: engine processes on this node; 0 = one per "
                                    "visible GPU (divided by gpus_per_worker)")
    gpu_memory_utilization: float = field(0.9, gt=0, le=1, help="backend=vllm: share of each GPU vLLM may use")
    max_retries: int = field(2, ge=0, help="times a worker that died (process killed, out of memory, Ray node lost) "
                             "is replaced and its shard redone from scratch (ray: restarts of each worker; vllm_dp: "
                             "deaths per shard); then the run stops naming the shard (finished shards are kept)")
    send_text: bool = field(False, help="false: each worker reads its shard's byte range of the corpus file itself "
                            "(the driver holds ids and hashes only; the file must be readable on every worker); "
                            "true: the driver sends each shard's text (workers without the file)")

    def worker_gpus(self) -> float:
        """GPUs of one worker (``gpus_per_worker``, or its default for the backend)."""
        if self.gpus_per_worker is not None:
            return self.gpus_per_worker
        from memreader.core.vllm_engine import on_gpu

        # a cluster's workers are assumed to have GPUs (its head may have none); locally, what this machine has
        remote = self.ray_address.strip() not in ("", "local") and self.engine == "ray"
        return float(self.backend == "vllm" and (remote or on_gpu()))

    def problems(self) -> list[str]:
        """Problems beyond types."""
        problems = super().problems()
        if self.engine not in ENGINES:
            problems.append(f"engine: {self.engine!r} is not one of {', '.join(ENGINES)}")
        if self.backend == "openai":
            problems.append("backend: openai is one server that batches by itself; read through it with "
                            "`memreader read` (batch_size = requests in flight) instead of read-dist")
        if self.worker_gpus() > 1 and not float(self.worker_gpus()).is_integer():
            problems.append(f"gpus_per_worker={self.gpus_per_worker}: above 1 it must be a whole number (vLLM "
                            "tensor parallel size)")
        address = self.ray_address.strip()
        if address not in ("", "local", "auto") and ":" not in address.removeprefix("ray://"):
            problems.append(f"ray_address={address!r}: give '<head>:6379', 'ray://<head>:10001', 'auto', or leave it "
                            "empty for a local instance")
        return problems


def read_distributed(cfg: DistributedReadConfig) -> dict[str, Any]:
    """Read every shard not yet finished, then merge; returns the run summary. One driver per run folder."""
    out_dir = run_dir(cfg.run, "read")
    with RunLock(out_dir):
        return _run(resolved(cfg), out_dir)  # backend/dtype auto decided once, by the driver, for every worker


def _run(cfg: DistributedReadConfig, out_dir: Path) -> dict[str, Any]:
    plan = plan_file_shards(cfg.input, cfg.shard_size, cfg.id_field, cfg.text_field, cfg.limit or None)
    if not plan.shards:
        raise cfg.no_text(plan.empty)
    key = read_key(cfg)
    if cfg.backend == "vllm" and cfg.adapter and (cfg.lora_mode == "merge" or (cfg.lora_mode == "auto" and
                                                                                 not cfg.worker_gpus())):
        from memreader.core.lora import merged_model

        merged_model(cfg.adapter, base=cfg.model, dtype=cfg.dtype)  # once, here, not by every worker at once
    store = ShardStore(out_dir)
    todo = _todo(cfg, store, plan, key)
    write_resolved_config(out_dir, cfg)
    print(f"read-dist: {plan.documents} documents in {len(plan.shards)} shard(s) of up to {cfg.shard_size}; "
          f"{len(plan.shards) - len(todo)} already done, {len(todo)} to read (engine={cfg.engine})")
    t0 = time.perf_counter()
    results = _read_shards(cfg, todo, out_dir, key)
    raise_shard_errors(results)
    redone = cut_off_shards(store)
    merged = merge_shards(store, plan.shards, out_dir / "memories.jsonl")
    summary = _summary(cfg, plan, todo, results, [store.marker(s) or {} for s in plan.shards], merged,
                       time.perf_counter() - t0)
    summary["redone"], summary["memories"] = redone, str(out_dir / "memories.jsonl")
    write_json(out_dir / "summary.json", summary)
    _report(cfg, summary, out_dir)
    return summary


def _todo(cfg: DistributedReadConfig, store: ShardStore, plan: FilePlan, key: str) -> list[Shard]:
    """The shards to read (not done), after checking the plan and the markers against earlier runs."""
    store.check_plan(plan.shards, {"shard_size": cfg.shard_size, "documents": plan.documents})
    for left in store.remove_attempts():
        log.warning("removed %s, left by a worker that died in an earlier run", left.name)
    states = {s.index: store.state(s, key) for s in plan.shards}  # refuses markers of other documents or settings
    todo = [s for s in plan.shards if states[s.index] != "done"]
    return [s.with_text() for s in todo] if cfg.send_text else todo


def _read_shards(cfg: DistributedReadConfig, todo: list[Shard], out_dir: Path, key: str) -> dict[int, dict[str, Any]]:
    """Every shard of ``todo`` read by the configured engine: shard index → its marker (or ``{"error": ...}``)."""
    if not todo:
        return {}
    resolve_model(cfg.model)  # the embedded model is converted here once, not by every worker at the same time
    if cfg.engine == "ray":
        from memreader.inference.ray_engine import run_ray

        return run_ray(cfg, todo, out_dir, key)
    from memreader.inference.dp_engine import run_data_parallel

    return run_data_parallel(cfg, todo, out_dir, key)


def _summary(cfg: DistributedReadConfig, plan: FilePlan, todo: list[Shard], results: dict[int, dict[str, Any]],
             markers: list[dict[str, Any]], merged: int, seconds: float) -> dict[str, Any]:
    fresh = [r for r in results.values() if not r.get("skipped")]
    n_read = sum(r["read"] for r in fresh)
    return {
        "documents": plan.documents, "shards": len(plan.shards), "shard_size": cfg.shard_size, "engine": cfg.engine,
        "shards_read": len(fresh), "shards_skipped": len(plan.shards) - len(fresh), "read": n_read,
        "skipped_done": plan.documents - sum(len(s.refs) for s in todo), "memories_written": merged,
        "skipped_empty": plan.empty, "failed": {d: e for m in markers for d, e in m.get("failed", {}).items()},
        "truncated_skipped": sum(m.get("truncated_skipped", 0) for m in markers),
        "workers": sorted({f"{r['host']}:{r['pid']}" for r in fresh}),
        "nodes": sorted({r["node"] for r in fresh if r.get("node")}),  # Ray node ids (engine=ray)
        "seconds": round(seconds, 2), "docs_per_s": round(n_read / seconds, 3) if n_read and seconds else None,
    }


def _report(cfg: DistributedReadConfig, summary: dict[str, Any], out_dir: Path) -> None:
    """The run's last lines; a run whose every document failed or was cut off is an error."""
    on_nodes = f" on {len(summary['nodes'])} Ray node(s)" if summary["nodes"] else ""
    print(f"read-dist: {summary['read']} docs in {summary['shards_read']} shard(s) in {summary['seconds']:.1f}s "
          f"({summary['docs_per_s']} docs/s) by {len(summary['workers'])} worker(s){on_nodes}; "
          f"{summary['shards_skipped']} shard(s) already done; {summary['memories_written']} memories merged → "
          f"{summary['memories']}")
    warn_unwritten(summary["failed"], summary["truncated_skipped"], cfg.max_new_tokens, "; rerun to ask them again")
    empty = summary["skipped_empty"]
    if empty:
        print(f"NOTE: {len(empty)} document(s) with empty text were skipped (no model call): {empty[:5]}")
    if summary["shards_read"] and summary["read"] == 0:
        raise RunFailed(f"every document of the {summary['shards_read']} shard(s) read failed or was cut off; nothing "
                        f"was written", f"see the warnings above and {out_dir / 'summary.json'}")


def cut_off_shards(store: ShardStore) -> list[str]:
    """The shards a worker died in the middle of during this run (its process killed, out of memory, or its Ray
    node lost), named in a warning: each left an attempt folder (removed now) and, as every shard is finished by
    the time this is called, was read again from scratch by another worker."""
    names = sorted({p.name[1:].split(".attempt-")[0] for p in store.remove_attempts()})
    if names:
        print(f"read-dist: WARNING: a worker died in the middle of {', '.join(names)} (process killed, out of memory, "
              "or its Ray node lost); read again from scratch by another worker and merged once")
    return names


def raise_shard_errors(results: dict[int, dict[str, Any]]) -> None:
    """A shard whose worker raised (not died): the first error, with the shard named; never retried,
    as the same input would fail the same way."""
    errors = {i: r["error"] for i, r in sorted(results.items()) if "error" in r}
    if not errors:
        return
    i, err = next(iter(errors.items()))
    if not err["user_error"]:
        log.error("shard-%05d: traceback on %s:\n%s", i, err["host"], err["traceback"])
    others = f" (and {len(errors) - 1} more shard(s): shard-{', shard-'.join(f'{k:05d}' for k in list(errors)[1:4])})"
    raise ShardError(f"shard-{i:05d} failed on {err['host']}: {err['type']}: {err['message']}"
                     f"{others if len(errors) > 1 else ''}",
                     "fix the cause and rerun the same command: finished shards are kept and not read again")


STAGE = Stage("read-dist", "read a corpus in shards on several GPUs or a Ray cluster, merged into one memories file "
              "(resumable)", run=read_distributed, config=DistributedReadConfig, example_dir="configs/inference/",
              models=reader_stage.models)

if __name__ == "__main__":
    from memreader.cli import module_main

    raise SystemExit(module_main("read-dist"))
