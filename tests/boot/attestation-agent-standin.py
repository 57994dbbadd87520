"""Stand-in for attestation-agent in the boot tests: record what it would find when it starts.

Runs inside the booted test rootfs as ``attestation-agent.service`` and writes
``/var/lib/attestation-agent-standin/record.json``: the agent unit's state and exit time, this
unit's start time (both systemd's monotonic microseconds), the status.json and CDI spec as they
are at that moment, and whether the nvidia-persistenced the agent started is alive (the first
NVML client must not be this one). The agent's root comes from ``PODVM_GPU_ROOT`` (default
``/``). Only the standard library: this is the image's python3.
"""

import json
import os
import subprocess

OUT = "/var/lib/attestation-agent-standin"
SHOW = ["ActiveState", "SubState", "Result", "ExecMainStatus", "ExecMainExitTimestampMonotonic",
        "InactiveExitTimestampMonotonic"]


def unit_properties(unit: str) -> dict:
    out = subprocess.run(["systemctl", "show", unit, "-p", ",".join(SHOW)],
                         capture_output=True, text=True, timeout=30).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def read_text(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def main() -> None:
    root = os.environ.get("PODVM_GPU_ROOT", "/")

    def under(path: str) -> str:
        return os.path.join(root, path.lstrip("/"))

    status = read_text(under("/run/podvm-gpu/status.json"))
    pid = (read_text(under("/var/run/nvidia-persistenced/nvidia-persistenced.pid")) or "").strip()
    record = {
        "root": root,
        "agent_unit": unit_properties("podvm-gpu.service"),
        "standin_unit": unit_properties("attestation-agent.service"),
        "status": json.loads(status) if status else None,
        "spec_present": os.path.exists(under("/var/run/cdi/nvidia.yaml")),
        "persistenced_alive": pid.isdigit() and os.path.exists(f"/proc/{pid}"),
    }
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "record.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
