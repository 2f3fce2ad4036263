"""What this machine computes fastest: a short matmul probe, cached per machine, that decides ``dtype: auto``.

On a GPU ``auto`` is bfloat16. On a CPU the answer depends on the processor: a CPU with AVX-512 BF16 (or AMX)
multiplies bf16 matrices two to three times faster than fp32, one without it emulates bf16 a hundred times
slower. Instead of guessing from feature flags, :func:`matmul_rates` times both dtypes on square matrices of the
size a small model's layers use, and :func:`cpu_dtype` picks the faster one. The result is cached in
``$MEMREADER_HOME/hardware.json``, keyed by the CPU model, the torch version and the thread count, so the probe
(under a second) runs once per machine; ``MEMREADER_CPU_DTYPE=float32|bfloat16`` overrides it.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from typing import Any

from memreader.core.paths import memreader_home, write_atomic

log = logging.getLogger(__name__)

PROBE_N = 1024  # matrix side: the width of a 135M-1.5B model's projections
PROBE_SECONDS = 0.25  # time spent per dtype once warmed up
PROBE_SMALL = 256  # the side a dtype is timed on first (milliseconds even where the CPU emulates it)
CPU_DTYPES = ("float32", "bfloat16")
_CACHE_NAME = "hardware.json"
_memo: dict[str, dict[str, Any]] = {}


def _cpuinfo(name: str) -> str | None:
    """The value of the first ``/proc/cpuinfo`` line that starts with ``name`` (None where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(name)), None)
    except OSError:
        return None


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``), or the platform's description."""
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def cpu_cores() -> int:
    """The CPU cores this process may run on: its affinity mask where the OS has one (``taskset``, a container's
    cpuset), else every core. The one count every part of MemReader uses (threads, the engine measurements' key)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def cpu_threads() -> int:
    """Threads a model runs with on a CPU: ``OMP_NUM_THREADS`` when it is set to a positive number (the user's,
    e.g. with ``taskset``), else :func:`cpu_cores`."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    return cpu_cores()


def use_cpu_threads(threads: int = 0) -> int:
    """Set torch's thread count for a model about to run on the CPU (``0``: :func:`cpu_threads`); returns it. Only
    code that runs a model on the CPU calls this: deciding a device or dtype never changes torch's threads."""
    import torch

    threads = threads or cpu_threads()
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


def cpu_flags() -> list[str]:
    """The CPU's flags that decide how fast bf16 runs (``/proc/cpuinfo``)."""
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    return [x for x in (_cpuinfo("flags") or "").split() if x in wanted]


def matmul_rate(dtype: str, n: int = PROBE_N, seconds: float = PROBE_SECONDS) -> float:
    """GFLOP/s of ``n x n`` matmuls in ``dtype`` on the CPU with torch's current thread count. Timed on
    ``PROBE_SMALL`` matrices first: a dtype so slow there that one ``n x n`` product would take longer than
    ``seconds`` (bf16 on a CPU that emulates it, ~1 GFLOP/s: two seconds a 1024 product, seventeen at 2048) has its
    answer already, and is not timed at ``n``."""
    small = _timed_rate(dtype, min(n, PROBE_SMALL), seconds)
    if n <= PROBE_SMALL or 2.0 * n**3 / (small * 1e9) > seconds:
        return small
    return _timed_rate(dtype, n, seconds)


def _timed_rate(dtype: str, n: int, seconds: float) -> float:
    import torch

    tdtype = getattr(torch, dtype)
    a = torch.randn(n, n).to(tdtype)
    b = torch.randn(n, n).to(tdtype)
    t0 = time.perf_counter()
    torch.mm(a, b)  # warm-up (and a first timing for dtypes that are very slow)
    first = time.perf_counter() - t0
    reps = max(1, min(200, int(seconds / max(first, 1e-6))))
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.mm(a, b)
    dt = time.perf_counter() - t0
    return 2.0 * n**3 * reps / dt / 1e9


def _key(threads: int) -> str:
    import torch

    return f"{cpu_model()}|torch={torch.__version__}|threads={threads}"


def matmul_rates(threads: int | None = None, refresh: bool = False) -> dict[str, Any]:
    """The cached probe for this machine: ``{"float32": GFLOP/s, "bfloat16": GFLOP/s, "best": dtype, ...}``."""
    import torch

    threads = threads or torch.get_num_threads()
    key = _key(threads)
    if not refresh and key in _memo:
        return _memo[key]
    path = memreader_home() / _CACHE_NAME
    cache: dict[str, Any] = {}
    if path.is_file():
        try:
            cache = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            log.warning("%s is unreadable (%s); probing again", path, exc)
    if not refresh and isinstance(cache.get(key), dict) and "best" in cache[key]:
        _memo[key] = cache[key]
        return cache[key]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rates = {d: round(matmul_rate(d), 1) for d in CPU_DTYPES}
    finally:
        torch.set_num_threads(before)
    entry = {**rates, "best": max(CPU_DTYPES, key=lambda d: rates[d]), "n": PROBE_N, "threads": threads,
             "flags": cpu_flags(), "cpu": cpu_model(), "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
    log.info("CPU matmul probe: fp32 %.0f GFLOP/s, bf16 %.0f GFLOP/s -> dtype auto = %s (cached in %s)",
             rates["float32"], rates["bfloat16"], entry["best"], path)
    cache[key] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(cache, indent=2, sort_keys=True) + "\n")
    except OSError as exc:  # a read-only home still gets the measured answer, just not cached
        log.warning("could not cache the CPU probe in %s (%s); it runs again next process", path, exc)
    _memo[key] = entry
    return entry


def cpu_dtype(threads: int | None = None) -> str:
    """``float32`` or ``bfloat16``: the env override ``MEMREADER_CPU_DTYPE`` if set, else the faster by the probe
    (run with ``threads``, default :func:`cpu_threads`: the threads a model will run with)."""
    forced = os.environ.get("MEMREADER_CPU_DTYPE", "").strip()
    if forced:
        if forced not in CPU_DTYPES:
            raise ValueError(f"MEMREADER_CPU_DTYPE={forced!r} is not one of {', '.join(CPU_DTYPES)}; unset it to "
                             "let the matmul probe decide")
        return forced
    return str(matmul_rates(threads or cpu_threads())["best"])
