"""Helpers of the exporter's network tests (test_metrics_server.py, test_metrics_prometheus.py,
bench/metrics.py): start a serving exporter, make a TLS certificate with ``openssl``, hold idle
connections, run a process under a pids cgroup of the unit's ``TasksMax``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from boot.image import unavailable

REPO = Path(__file__).resolve().parents[1]
UNIT = REPO / "systemd/podvm-gpu-metrics.service"


def unit_tasks_max() -> int:
    """``TasksMax=`` of the shipped metrics unit."""
    for line in UNIT.read_text().splitlines():
        if line.startswith("TasksMax="):
            return int(line.split("=", 1)[1])
    raise AssertionError(f"{UNIT} has no TasksMax=")


class Serving:
    """A ``python -m podvm_gpu.metrics --listen 127.0.0.1:0`` child; ``base`` is its URL
    (``http://127.0.0.1:PORT``), ``port`` its port."""

    def __init__(self, proc: subprocess.Popen, first_line: str):
        self.proc = proc
        self.first_line = first_line
        where = first_line.split("serving ", 1)[1].split("/metrics", 1)[0]
        self.base = where
        self.port = int(where.rsplit(":", 1)[1])

    def stop(self) -> str:
        """Terminate it; its remaining stderr."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=30)
        return err or ""


def start(root: Path, env: dict, *args: str, preexec=None, listen: str = "127.0.0.1:0") -> Serving:
    """Start the exporter serving at ``listen`` with ``args`` (``--web-config F``); waits for its
    ``serving`` line.

    Raises:
        AssertionError: it exited or printed something else first (its stderr is in the message).
    """
    proc = subprocess.Popen([sys.executable, "-m", "podvm_gpu.metrics", "--root", str(root),
                             "--listen", listen, *args], stderr=subprocess.PIPE, text=True,
                            env=env, preexec_fn=preexec)
    line = proc.stderr.readline()
    if "serving " not in line:
        try:
            rest = proc.communicate(timeout=10)[1]
        except subprocess.TimeoutExpired:
            proc.kill()
            rest = proc.communicate(timeout=30)[1]
        raise AssertionError(f"the exporter did not serve: {line}{rest}")
    return Serving(proc, line)


def make_cert(folder: Path, name: str = "server") -> tuple[Path, Path]:
    """A self-signed EC certificate for ``127.0.0.1`` and ``localhost`` (``openssl req``, Debian
    package ``openssl``); ``(cert, key)``."""
    if shutil.which("openssl") is None:
        unavailable("openssl is missing (Debian package openssl, .ci/apt-packages.txt)")
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def hold_idle(port: int, count: int, partial: bytes = b"GET /metrics HTTP/1.1\r\n") -> list:
    """Open ``count`` connections to 127.0.0.1:``port`` that each send ``partial`` (a request
    line, no end of headers) and then nothing; the caller closes them."""
    held = []
    try:
        for _ in range(count):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(partial)
            held.append(s)
    except BaseException:
        close_all(held)
        raise
    return held


def close_all(sockets: list) -> None:
    for s in sockets:
        try:
            s.close()
        except OSError:
            pass


def threads_of(pid: int) -> int:
    """Threads of process ``pid`` now (``/proc/PID/task``)."""
    return len(os.listdir(f"/proc/{pid}/task"))


@contextmanager
def pids_cgroup(name: str, limit: int):
    """A pids cgroup with ``pids.max`` = ``limit``, as a unit's ``TasksMax=`` makes; yields a
    ``preexec_fn`` that moves the child into it. cgroup v1 (``/sys/fs/cgroup/pids``, as on these
    hybrid machines) or v2 (a child of the root with the pids controller). Removed after.

    Unavailable (fail in CI) when neither can be made (not root, no pids controller).
    """
    v1 = Path("/sys/fs/cgroup/pids")
    v2 = Path("/sys/fs/cgroup")
    if v1.is_dir() and (v1 / "cgroup.procs").exists():
        group = v1 / name
    elif (v2 / "cgroup.controllers").exists() and "pids" in (v2 / "cgroup.subtree_control").read_text():
        group = v2 / name
    else:
        unavailable("no pids cgroup controller to imitate TasksMax with")
    try:
        group.mkdir(exist_ok=True)
        (group / "pids.max").write_text(f"{limit}\n")
    except OSError as err:
        unavailable(f"cannot make the pids cgroup {group}: {err}")
    procs = str(group / "cgroup.procs")

    def enter() -> None:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))

    try:
        yield enter
    finally:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)  # its last process is still exiting
