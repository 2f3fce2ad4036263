"""Test-only fault injection for ``read-dist`` workers (Ray actors and ``vllm_dp`` processes), kept out of the
product: the ``die_in_shard`` fixture (tests/conftest.py) puts this folder on the workers' ``PYTHONPATH`` (the driver
forwards it with every ``MEMREADER_*`` variable), so Python imports this file when a worker starts.

``MEMREADER_TEST_DIE_IN_SHARD=<shard index>:<flag file>``: the first worker to read that shard (while the flag file
does not exist) creates the flag and kills its own process right after the shard's first batch is written, as a
crash, OOM kill or lost node would. It wraps ``memreader.inference.shards.read_shard`` as soon as that module is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import socket
import sys
from pathlib import Path
from typing import Any

DIE_ENV = "MEMREADER_TEST_DIE_IN_SHARD"


def _dying_read_shard(read_shard: Any) -> Any:
    def read(cfg: Any, shard: Any, out_dir: Any, backend: Any, key: str) -> Any:
        index, _, flag_path = os.environ.get(DIE_ENV, "").partition(":")
        flag = Path(flag_path)
        if not flag_path or int(index) != shard.index or flag.exists():
            return read_shard(cfg, shard, out_dir, backend, key)
        generate, calls = backend.generate_many, [0]

        def dying(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] == 2:  # the first batch of this shard is on disk: die in the middle of the shard
                flag.write_text(f"{socket.gethostname()} {os.getpid()} {shard.name}\n", encoding="utf-8")
                print(f"{DIE_ENV}: killing worker process {os.getpid()} in the middle of {shard.name}",
                      file=sys.stderr, flush=True)
                os._exit(1)
            return generate(*args, **kwargs)

        backend.generate_many = dying
        try:
            return read_shard(cfg, shard, out_dir, backend, key)
        finally:
            backend.generate_many = generate

    return read


class _PatchShards(importlib.abc.MetaPathFinder):
    """Wraps ``read_shard`` right after ``memreader.inference.shards`` executes, before anyone imports the name."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "memreader.inference.shards":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            module.read_shard = _dying_read_shard(module.read_shard)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get(DIE_ENV):
    sys.meta_path.insert(0, _PatchShards())
