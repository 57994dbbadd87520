"""Stand-in for kata-agent in the boot tests: record what kata-agent would find when it starts.

Runs inside the booted test rootfs as ``kata-agent.service`` and writes
``/var/lib/kata-agent-standin/record.json`` (under /var/lib: /run and /tmp do not survive the
container). The root the agent worked on comes from ``PODVM_GPU_ROOT`` (default ``/``), set by the
GPU test's drop-in exactly as for the agent. Only the standard library: this is the image's python3.
"""

import json
import os
import subprocess
import time

OUT = "/var/lib/kata-agent-standin"
# The podman boots (tests/boot/podman_image.py): the CDI requests to run as containers, and the
# local image; the shell inside lists /dev, prints the environment and the mount points
# the container got.
PODMAN_REQUESTS = os.environ.get("KATA_STANDIN_PODMAN", "").split()
PODMAN_IMAGE = "localhost/podvm-gpu-test:1"
CONTAINER_SCRIPT = ("/bin/busybox ls -ln /dev; echo ---; /bin/busybox env; echo ---; "
                    "/bin/busybox cut -d' ' -f2 /proc/self/mounts")
# A module to load after the agent's unit (the module lock boots): modules_disabled's proof.
PROBE_MODULE = os.environ.get("KATA_STANDIN_MODPROBE", "")
SHOW = ["ActiveState", "SubState", "Result", "ExecMainStatus", "ExecMainPID", "ExecMainStartTimestampMonotonic",
        "ExecMainExitTimestampMonotonic", "InactiveExitTimestampMonotonic"]


def under_root(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def unit_properties(unit: str) -> dict:
    # As root, systemctl reaches PID 1 over its private socket: no D-Bus needed (minbase has none).
    out = subprocess.run(["systemctl", "show", unit, "-p", ",".join(SHOW)],
                         capture_output=True, text=True, timeout=30).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def daemon(root: str) -> dict | None:
    """The nvidia-persistenced the agent started: is it alive now, and in which cgroup."""
    pid = (read_text(under_root(root, "/var/run/nvidia-persistenced/nvidia-persistenced.pid")) or "").strip()
    if not pid.isdigit():
        return None
    return {"pid": int(pid), "alive": os.path.exists(f"/proc/{pid}"),
            "cgroup": read_text(f"/proc/{pid}/cgroup")}


def podman_run(root: str, request: str) -> dict:
    """``podman run --device REQUEST`` of the local image, as kata-agent would start a pod's
    container: the CDI library reads /etc/cdi and /var/run/cdi, so when the agent worked on
    another root its CDI folder is bound over /run/cdi in a mount namespace of this run only."""
    argv = ["podman", "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs", "--events-backend",
            "none", "run", "--rm", "--pull", "never", "--network", "none", "--device", request,
            PODMAN_IMAGE, "/bin/busybox", "sh", "-c", CONTAINER_SCRIPT]
    if root != "/":
        argv = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                'mkdir -p /run/cdi && mount --bind "$0/var/run/cdi" /run/cdi && exec "$@"',
                root, *argv]
    started = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=240)
        rc, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = None, str(e.stdout or ""), f"timed out after 240 s: {e.stderr or ''}"
    return {"request": request, "rc": rc, "stdout": out, "stderr": err,
            "seconds": round(time.monotonic() - started, 2)}


def module_lock_probe(module: str) -> dict:
    """kernel.modules_disabled as the agent's unit left it, then ``modprobe MODULE``."""
    before = (read_text("/proc/sys/kernel/modules_disabled") or "").strip()
    done = subprocess.run(["modprobe", module], capture_output=True, text=True, timeout=60)
    return {"modules_disabled": before, "module": module, "modprobe_rc": done.returncode,
            "modprobe_stderr": done.stderr.strip(),
            "loaded_after": os.path.isdir(f"/sys/module/{module}")}


def main() -> None:
    started = time.clock_gettime(time.CLOCK_MONOTONIC)
    root = os.environ.get("PODVM_GPU_ROOT") or "/"
    spec = read_text(under_root(root, "/var/run/cdi/nvidia.yaml"))
    status = read_text(under_root(root, "/run/podvm-gpu/status.json"))
    record = {
        "standin_started_monotonic_us": int(started * 1_000_000),
        "root": root,
        "cdi_dir": sorted(os.listdir(under_root(root, "/var/run/cdi")))
        if os.path.isdir(under_root(root, "/var/run/cdi")) else None,
        "spec": spec,
        "status": json.loads(status) if status else None,
        "agent_unit": unit_properties("podvm-gpu.service"),
        "persistenced_unit": unit_properties("podvm-gpu-persistenced.service"),
        "standin_unit": unit_properties("kata-agent.service"),
        "persistenced": daemon(root),
        "nvidia_units_ran": sorted(n for n in os.listdir("/var/lib") if n.startswith("nvidia-unit-ran-")),
    }
    if PROBE_MODULE:  # before the containers: nothing they do can change it
        record["module_lock"] = module_lock_probe(PROBE_MODULE)
    if PODMAN_REQUESTS:
        record["podman"] = [podman_run(root, request) for request in PODMAN_REQUESTS]
    journal = subprocess.run(["journalctl", "-b", "--no-pager", "-o", "short-monotonic"],
                             capture_output=True, text=True, timeout=30).stdout
    agent_journal = subprocess.run(["journalctl", "-b", "--no-pager", "-o", "json",
                                    "_SYSTEMD_UNIT=podvm-gpu.service", "+", "UNIT=podvm-gpu.service"],
                                   capture_output=True, text=True, timeout=30).stdout
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "journal.txt"), "w", encoding="utf-8") as f:
        f.write(journal)
    with open(os.path.join(OUT, "agent-journal.json"), "w", encoding="utf-8") as f:
        f.write(agent_journal)
    with open(os.path.join(OUT, "record.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


if __name__ == "__main__":
    main()
