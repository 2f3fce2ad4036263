"""The ``ray`` engine of :mod:`memreader.inference.distributed`: Ray Data over the shards, an actor pool of
:class:`ShardWorker`, each loading the backend once and reading one shard per call; joining or starting Ray,
checking that the cluster holds the workers asked for."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

from memreader.core.errors import MemReaderError
from memreader.inference.shards import Shard
from memreader.inference.workers import describe_error, worker_backend, worker_env, workers_died

log = logging.getLogger(__name__)


class RayUnreachable(MemReaderError, ConnectionError):
    """No Ray cluster answers at the configured address."""


class ShardWorker:
    """One Ray Data worker: loads the backend once, then reads one shard per call. An exception is
    returned to the driver as data (raised there, with the shard's name); a dead process is Ray's to
    restart, and its shard is redone from scratch."""

    def __init__(self, cfg: Any, out_dir: str, key: str) -> None:
        import ray

        self.cfg, self.out_dir, self.key = cfg, Path(out_dir), key
        self.backend, self.error = None, None
        self.node = ray.get_runtime_context().get_node_id()  # the Ray node this worker runs on, for the summary
        try:
            self.backend = worker_backend(cfg)
        except Exception as exc:  # reported for each of its shards, then raised by the driver
            self.error = describe_error(exc)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        from memreader.inference.shards import read_shard

        out = []
        for index, payload in zip(batch["shard"], batch["docs"], strict=True):
            shard = Shard.from_payload(int(index), str(payload))
            if self.error is not None:
                out.append({"shard": shard.index, "error": self.error})
                continue
            try:
                out.append({**read_shard(self.cfg, shard, self.out_dir, self.backend, self.key), "node": self.node})
            except Exception as exc:  # returned to the driver, which raises it naming the shard
                out.append({"shard": shard.index, "error": describe_error(exc)})
        return {"shard": np.asarray(batch["shard"]), "result": np.asarray([json.dumps(r) for r in out], dtype=object)}


def connect_ray(cfg: Any) -> bool:
    """Start or join Ray as ``ray_address`` says; True when this call connected (so the run disconnects)."""
    import ray

    if ray.is_initialized():
        log.info("read-dist: using the Ray instance this process is already connected to")
        return False
    runtime_env = {"env_vars": worker_env()}
    address = cfg.ray_address.strip()
    if address in ("", "local"):
        start_local_ray(ray, cfg, runtime_env)
        return True
    fix = ("start the cluster on its head node with `ray start --head` (then ray_address=<head>:6379, or "
           "ray://<head>:10001 for Ray Client), check the address and the firewall, or leave ray_address empty "
           "to start a local Ray instance on this machine")
    if address != "auto":
        probe_address(address, cfg.connect_timeout_s, fix)
    join_ray(ray, address, runtime_env, fix)
    return True


TOKEN_FIX = ("the cluster wants Ray's token authentication (Ray 2.60 turns it on for a cluster that `ray.init()` "
             "starts, and for `ray start` where ~/.ray/auth_token exists), and Ray sends no token to an address given "
             "by hand: set RAY_AUTH_MODE=token here and give the cluster's token (~/.ray/auth_token, "
             "RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN); or start the cluster with RAY_AUTH_MODE=disabled")


def join_ray(ray: Any, address: str, runtime_env: dict[str, Any], fix: str) -> None:
    """``ray.init`` on a running cluster; a failure is :class:`RayUnreachable` with the fix (the token one when the
    cluster refused this driver's credentials)."""
    try:
        ray.init(address=address, runtime_env=runtime_env)
    except (ConnectionError, TimeoutError, RuntimeError, SystemExit) as exc:  # Ray exits when GCS never answers
        chain, cause = [], exc
        while cause is not None:
            chain.append(f"{type(cause).__name__}: {cause}")
            cause = cause.__cause__ or cause.__context__
        token = any("AuthenticationError" in c or "InvalidAuthToken" in c for c in chain)
        raise RayUnreachable(f"could not join the Ray cluster at ray_address={address!r}: {exc}"
                             + (" (the cluster refused this driver's authentication token)" if token else ""),
                             TOKEN_FIX if token else fix) from exc


LOCAL_START_TRIES = 2  # Ray waits a fixed 30 s for its own raylet; a loaded machine can miss that once
START_TIMEOUTS = ("timed out during startup",  # the raylet did not register in time
                  "Timed out waiting for file")  # the GCS server did not write its port file in time (a CI run hit it)


def start_local_ray(ray: Any, cfg: Any, runtime_env: dict[str, Any]) -> None:
    """Start a private Ray instance on this machine. Ray gives its raylet a fixed 30 s to register (and its GCS
    server a fixed wait for its port file); on a busy machine (a CI runner, a machine still tearing down the last
    instance) that can time out, so a timed-out start is shut down and tried once more, saying so; a second timeout
    is an error naming the fixes."""
    import psutil  # a dependency of Ray (vendored) and of vLLM

    for attempt in range(1, LOCAL_START_TRIES + 1):
        before = {c.pid for c in psutil.Process().children(recursive=True)}
        try:
            ray.init(address="local", num_cpus=cfg.ray_num_cpus or None, include_dashboard=False,
                     runtime_env=runtime_env)
            return
        except Exception as exc:  # Ray raises a bare Exception for this timeout; anything else is re-raised
            if not any(timeout in str(exc) for timeout in START_TIMEOUTS):
                raise
            ray.shutdown()
            _stop_new_children(before)  # the half-started node's GCS and raylet: Ray keeps no handle on them
            if attempt == LOCAL_START_TRIES:
                raise RayUnreachable(
                    f"the local Ray instance did not start: {exc} (tried {LOCAL_START_TRIES} times)",
                    "free CPU and memory on this machine and rerun (finished shards are kept), check the "
                    "raylet logs under /tmp/ray/session_latest/logs, or start Ray yourself with `ray start "
                    "--head` and set ray_address=auto") from exc
            log.warning("read-dist: WARNING: the local Ray instance timed out during startup (%s); "
                        "shut it down, starting it again (try %d of %d)", exc, attempt + 1, LOCAL_START_TRIES)


def _stop_new_children(before: set[int], grace_s: float = 5.0) -> None:
    """Terminate (then kill) this process's children that were not there ``before``."""
    import psutil

    new = [c for c in psutil.Process().children(recursive=True) if c.pid not in before]
    for child in new:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.terminate()
    _, alive = psutil.wait_procs(new, timeout=grace_s)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    if new:
        log.warning("read-dist: stopped %d process(es) the failed Ray start left behind", len(new))


def probe_address(address: str, timeout: float, fix: str) -> None:
    """Fail fast unless a Ray server answers at ``address`` (``ray.init`` alone waits minutes on a dead
    address, then exits the process). One gRPC call that Ray's GCS (``<head>:6379``) or Ray Client server
    (``ray://<head>:10001``) implements; an answer of any kind but "unavailable", "timed out" or "not
    implemented" means Ray is there; "unauthenticated" too where ``ray.init`` will send a token
    (``RAY_AUTH_MODE=token``), else it would be refused after ~20 s: named now, with the fix."""
    import grpc

    client = address.startswith("ray://")
    host, _, port = address.removeprefix("ray://").rpartition(":")
    method = "/ray.rpc.RayletDriver/ClusterInfo" if client else "/ray.rpc.NodeInfoGcsService/GetClusterId"
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):  # TLS: leave the handshake to ray.init
        return
    channel = grpc.insecure_channel(f"{host}:{port}")
    try:
        channel.unary_unary(method, request_serializer=None, response_deserializer=None)(b"", timeout=timeout)
    except grpc.RpcError as exc:
        code = exc.code()
        reasons = {grpc.StatusCode.UNAVAILABLE: f"nothing answers: {exc.details()}",
                   grpc.StatusCode.DEADLINE_EXCEEDED: f"no answer within connect_timeout_s={timeout:g}s",
                   grpc.StatusCode.UNIMPLEMENTED: "a server answers, but it is not a Ray "
                   + ("Client server" if client else "head node (GCS)")}
        if code in reasons:
            raise RayUnreachable(f"no Ray cluster answers at ray_address={address!r} ({reasons[code]})", fix) from None
        if code == grpc.StatusCode.UNAUTHENTICATED and os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
            raise RayUnreachable(f"the Ray cluster at ray_address={address!r} wants an authentication token "
                                 f"({exc.details()}) and this driver has none to send", TOKEN_FIX) from None
    finally:
        channel.close()


def pool_size(cfg: Any, resources: dict[str, float], shards: int) -> int:
    """Workers for the Ray engine: ``num_workers`` or what the cluster holds, checked against it."""
    gpus, cpus = cfg.worker_gpus(), cfg.cpus_per_worker
    have_gpus, have_cpus = resources.get("GPU", 0.0), resources.get("CPU", 0.0)
    fits = int(min(have_gpus // gpus if gpus else float("inf"), have_cpus // cpus))
    if fits < 1:
        need = f"{gpus:g} GPU(s) and {cpus:g} CPU(s)" if gpus else f"{cpus:g} CPU(s)"
        raise MemReaderError(f"the Ray cluster ({have_gpus:g} GPUs, {have_cpus:g} CPUs) cannot hold one worker of "
                             f"{need}", "add GPU nodes for backend=vllm, or lower gpus_per_worker / cpus_per_worker")
    if cfg.num_workers > fits:
        raise MemReaderError(f"num_workers={cfg.num_workers} workers of {gpus:g} GPU(s) and {cpus:g} CPU(s) do not fit "
                             f"the Ray cluster ({have_gpus:g} GPUs, {have_cpus:g} CPUs): at most {fits}",
                             f"set num_workers={fits} or 0 (as many as fit), or add nodes")
    return max(1, min(cfg.num_workers or fits, shards))


def run_ray(cfg: Any, todo: list[Shard], out_dir: Path, key: str) -> dict[int, dict[str, Any]]:
    """Read ``todo`` with Ray Data; shard index → its marker (or ``{"error": ...}``)."""
    import ray

    started = connect_ray(cfg)
    try:
        workers = pool_size(cfg, ray.cluster_resources(), len(todo))
        nodes = sum(1 for n in ray.nodes() if n["Alive"])
        print(f"read-dist: Ray {ray.__version__}, {nodes} node(s), {workers} worker(s) of {cfg.cpus_per_worker:g} "
              f"CPU(s) and {cfg.worker_gpus():g} GPU(s), {len(todo)} shard(s)")
        rows = _read_with_pool(cfg, todo, out_dir, key, workers)
        return {int(r["shard"]): json.loads(r["result"]) for r in rows}
    finally:
        if started:
            ray.shutdown()


def _read_with_pool(cfg: Any, todo: list[Shard], out_dir: Path, key: str, workers: int) -> list[dict[str, Any]]:
    """The Ray Data pipeline: one block per shard, an actor pool of ``workers`` :class:`ShardWorker` actors, every one
    loaded before the first shard is dealt (so the shards spread over all of them, and a worker that no node can
    hold is an error after ``worker_start_timeout_s``, not a run that waits for ever)."""
    import ray
    import ray.data

    context = ray.data.DataContext.get_current()
    saved, context.wait_for_min_actors_s = context.wait_for_min_actors_s, cfg.worker_start_timeout_s
    try:
        ds = ray.data.from_items([{"shard": s.index, "docs": s.payload()} for s in todo], override_num_blocks=len(todo))
        with warnings.catch_warnings():  # Ray 2.60 has no named parameter for actor retries yet
            warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
            ds = ds.map_batches(
                ShardWorker, fn_constructor_kwargs={"cfg": cfg, "out_dir": str(out_dir), "key": key},
                batch_size=1, batch_format="numpy", num_cpus=cfg.cpus_per_worker, num_gpus=cfg.worker_gpus() or None,
                compute=ray.data.ActorPoolStrategy(size=workers, max_tasks_in_flight_per_actor=1),
                # a worker that dies is restarted (at most max_retries times) and its shard retried, from scratch
                # (read_shard never appends). Task retries are not counted: one lost node fails a call more than
                # once (the socket closes, then the dead address refuses it until the head marks the node dead),
                # and a bounded count ran out on one death (ActorUnavailableError)
                max_restarts=cfg.max_retries, max_task_retries=-1 if cfg.max_retries else 0)
        return ds.take_all()
    except ray.exceptions.GetTimeoutError as exc:
        have = ray.cluster_resources()
        raise MemReaderError(
            f"the Ray cluster did not start {workers} worker(s) of {cfg.cpus_per_worker:g} CPU(s) and "
            f"{cfg.worker_gpus():g} GPU(s) within worker_start_timeout_s={cfg.worker_start_timeout_s:g}: not all of "
            f"them found a node with room (the cluster's {have.get('CPU', 0):g} CPUs and {have.get('GPU', 0):g} GPUs "
            "are counted across its nodes; a worker needs its share on one), or a worker loads slowly",
            "lower cpus_per_worker / gpus_per_worker to what one node has, set num_workers lower, add nodes, or raise "
            "worker_start_timeout_s") from exc
    except ray.exceptions.RayActorError as exc:
        raise workers_died(cfg, todo, out_dir, key, f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
    finally:
        context.wait_for_min_actors_s = saved
