"""What every worker of :mod:`memreader.inference.distributed` shares, whichever engine runs it: the backend it loads, the
environment it gets from the driver, errors as data for the driver, and the error for workers that kept dying."""

from __future__ import annotations

import os
import socket
import traceback
from pathlib import Path
from typing import Any

from memreader.core.errors import MemReaderError
from memreader.core.paths import memreader_home
from memreader.inference.reader import make_backend
from memreader.inference.shards import Shard, ShardError, ShardStore


def describe_error(exc: BaseException) -> dict[str, Any]:
    """An exception raised in a worker, as data for the driver (which raises it with the shard's name)."""
    return {"type": type(exc).__name__, "message": str(exc), "host": socket.gethostname(),
            "user_error": isinstance(exc, (MemReaderError, FileNotFoundError, ImportError)),
            "traceback": "".join(traceback.format_exception(exc))}


def worker_backend(cfg: Any) -> Any:
    """The backend of one worker, loaded now (a worker that cannot load fails before its first shard): the engine
    :func:`memreader.inference.reader.make_backend` builds, on this worker's GPUs, or on the CPU with its share of
    the cores."""
    backend = make_backend(cfg, tensor_parallel_size=max(1, int(cfg.worker_gpus())),
                           gpu_memory_utilization=cfg.gpu_memory_utilization)
    if callable(getattr(backend, "model", None)):  # transformers: load the weights now
        model = backend.model()
        if next(model.parameters()).device.type == "cpu":  # a worker runs on its share of the cores
            from memreader.core.hardware import use_cpu_threads

            use_cpu_threads(max(1, int(cfg.cpus_per_worker)))
    return backend


def worker_env() -> dict[str, str]:
    """Environment a worker needs from the driver: the artifact root and every ``MEMREADER_*`` setting, offline
    flags, ``PYTHONPATH``."""
    forwarded = ("HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if v and (k in forwarded or k.startswith("MEMREADER_"))}
    env["MEMREADER_HOME"] = str(memreader_home())
    return env


def workers_died(cfg: Any, todo: list[Shard], out_dir: Path, key: str, what: str) -> ShardError:
    """The error for shards whose workers kept dying: names them, keeps the finished ones."""
    store = ShardStore(out_dir)
    left = [s.name for s in todo if store.state(s, key) == "todo"]
    return ShardError(f"{len(left)} shard(s) were not finished: {', '.join(left[:8])}{' ...' if len(left) > 8 else ''}; "
                      f"a worker reading them died with no retry left (max_retries={cfg.max_retries}; {what})",
                      "rerun the same command: finished shards are kept and the others are read again from scratch; "
                      "if workers keep dying, look at their logs (out of memory? lower batch_size or max_model_len) "
                      "or raise max_retries")
