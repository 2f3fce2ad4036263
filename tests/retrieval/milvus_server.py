"""A real Milvus standalone server for the tests: the ``milvus`` package from PyPI (installed by
``make setup`` with the ``dev`` extra), started as ``milvus-server`` on free ports with its data in a
temporary folder, waited for until it answers, killed and restarted on purpose.

Every port the server opens is chosen free here (the package's defaults — etcd on 2379, the proxy
on 19530 — would collide with a Milvus the developer runs, or with a second server of a parallel
test). Its metrics/health port is not configurable on the command line: the package picks the first
free one from 9091 and prints nothing, so readiness is checked the way a client sees it: a gRPC call
that answers.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

SESSION_TTL = 5
"""Seconds a crashed server's etcd session outlives it (Milvus' default: 30)."""
ROOT_TOKEN = "root:Milvus"
"""The token of the root user a new server with authorization starts with."""
# not --etcd-port: it only sets where Milvus looks for etcd, while the embedded etcd always listens on 2379 and
# 2380, so one server runs on a machine at a time
_PORT_FLAGS = ("--root-coord-port", "--proxy-internal-port", "--query-coord-port",
               "--query-node-port", "--index-coord-port", "--index-node-port", "--data-coord-port",
               "--data-node-port")


def server_command() -> str | None:
    """The ``milvus-server`` executable beside this Python, or None where the ``milvus`` package is absent."""
    exe = Path(sys.executable).with_name("milvus-server")
    return str(exe) if exe.is_file() else shutil.which("milvus-server")


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


class MilvusServer:
    """One ``milvus-server`` process group over ``data``; :attr:`uri` is its proxy address."""

    def __init__(self, data: Path, auth: bool = False, start_timeout: float = 90.0) -> None:
        exe = server_command()
        if exe is None:
            raise RuntimeError("milvus-server is not installed; run `make setup` (the dev extra installs `milvus`)")
        self.exe, self.data, self.auth, self.start_timeout = exe, Path(data), auth, start_timeout
        ports = free_ports(len(_PORT_FLAGS) + 1)
        self.port = ports[0]
        self._ports = dict(zip(_PORT_FLAGS, ports[1:], strict=True))
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log = self.data / "server.log"

    def start(self) -> MilvusServer:
        self.data.mkdir(parents=True, exist_ok=True)
        cmd = [self.exe, "--data", str(self.data), "--proxy-port", str(self.port)]
        for flag, port in self._ports.items():
            cmd += [flag, str(port)]
        if self.auth:
            cmd += ["--authorization-enabled", "true"]
        # After a crash the new process waits for the old one's etcd session to expire before it serves
        # (its log repeats "node not match"): 30 s by default, 5 s here so that a kill-and-restart test is short
        cmd += ["--extra-config", f"common.session.ttl={SESSION_TTL}"]
        with open(self.log, "ab") as log:
            # its own process group: the launcher runs the milvus binary as a child, a kill takes both
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        from pymilvus import MilvusClient
        from pymilvus.exceptions import MilvusException

        deadline = time.monotonic() + self.start_timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"milvus-server exited with {self.proc.returncode}; log: {self.tail()}")
            try:
                client = MilvusClient(uri=self.uri, token=ROOT_TOKEN if self.auth else "", timeout=2)
                client.list_collections()
                client.close()
                return
            except MilvusException as exc:
                last = exc
                time.sleep(0.5)
        self.kill()
        raise RuntimeError(f"milvus-server at {self.uri} not ready in {self.start_timeout:g} s ({last}); "
                           f"log: {self.tail()}")

    def tail(self, chars: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.is_file() else "(no log)"

    def kill(self) -> None:
        """SIGKILL the whole server (no flush, no goodbye): what a crashed host looks like."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 20 s)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self._signal(signal.SIGTERM, wait=20)
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int, wait: float = 30) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass  # the group is gone already: what both callers want
        try:
            self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            if sig != signal.SIGKILL:
                return
            raise
        # the launcher may be gone while the milvus binary still exits: wait until its proxy port is free
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and _listening(self.port):
            time.sleep(0.2)

    def restart(self, auth: bool | None = None) -> None:
        """Start again on the same ports and data (after :meth:`kill` or :meth:`stop`), with authorization
        switched to ``auth`` if given. The launcher is bypassed: it probes each port with a plain bind, which
        the connections of the last run (in TIME_WAIT for a minute) make fail, and then silently moves the proxy
        to the next free port; the server binary itself reuses the address, so it runs on the config the
        launcher wrote."""
        config = self.data / "configs" / "milvus.yaml"
        if auth is not None:
            text = config.read_text(encoding="utf-8")
            config.write_text(re.sub(r"authorizationEnabled: (true|false)", f"authorizationEnabled: {str(auth).lower()}",
                                     text), encoding="utf-8")
            self.auth = auth
        binary = self.data / "bin" / "milvus"
        env = {**os.environ, "DEPLOY_MODE": "STANDALONE", "METRICS_PORT": str(free_ports(1)[0]),
               "MILVUS_RUN_DIR": str(self.data / "run"),
               "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(binary.parent), os.environ.get("LD_LIBRARY_PATH")]))}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([str(binary), "run", "standalone"], cwd=self.data, env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0
