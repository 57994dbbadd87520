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
