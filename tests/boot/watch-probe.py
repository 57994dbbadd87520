#!/usr/bin/python3
"""Boot tests only (issue 34): what podvm-gpu-watch.service did in a real systemd boot.

Runs as watch-probe.service, after podvm-gpu-watch.service and before the kata-agent stand-in
(which then records the spec and status as they are, and powers off). After a ready boot it
waits for the watcher's watch.json, appends an Xid 79 record for the fake GPU to the fake
root's kernel log (the source the scenario tests use), and waits for status.json to turn
failed; after any other boot it waits for the watcher's unit to end. It writes
/srv/gpu/watch-probe.json (or /var/lib/watch-probe.json without a fake root).

With an attestation-agent stand-in (issue 43's revocation boot): ``WATCH_PROBE_AA_SOCKET``, a
socket to wait for before the Xid (the stand-in listening), and ``WATCH_PROBE_AA_REQUESTS``,
the stand-in's record of its requests to wait for after the flip.
"""

import json
import os
import subprocess
import time

ROOT = os.environ.get("PODVM_GPU_ROOT") or "/"
XID_79 = "NVRM: Xid (PCI:0000:00:04): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def path(host: str) -> str:
    return os.path.join(ROOT, host.lstrip("/"))


def unit() -> dict:
    out = subprocess.run(["systemctl", "show", "podvm-gpu-watch.service", "-p", "ActiveState",
                          "-p", "SubState", "-p", "Result", "-p", "ExecMainStatus",
                          "-p", "ConditionResult", "-p", "ExecMainStartTimestampMonotonic"],
                         capture_output=True, text=True, timeout=30).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def read_json(host: str):
    try:
        with open(path(host), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def wait(what, limit_s: float):
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(0.05)
    return what()


def main() -> None:
    before = read_json("/run/podvm-gpu/status.json") or {}
    record = {"status_before": before.get("state"), "binding_before": before.get("binding")}
    if record["status_before"] == "ready":
        record["watching"] = wait(lambda: read_json("/run/podvm-gpu/watch.json"), 60)
        record["unit_watching"] = unit()
        aa_socket = os.environ.get("WATCH_PROBE_AA_SOCKET")
        if aa_socket:
            record["aa_listening"] = bool(wait(lambda: os.path.exists(aa_socket), 60))
        kmsg = path("/dev/kmsg")
        with open(kmsg, encoding="utf-8", errors="replace") as f:
            seq = max(int(line.split(",")[1]) for line in f if line[:1].isdigit()) + 1
        with open(kmsg, "a", encoding="utf-8") as f:
            f.write(f"3,{seq},{time.monotonic_ns() // 1000},-;{XID_79}\n")
        sent = time.monotonic()
        flipped = wait(lambda: (read_json("/run/podvm-gpu/status.json") or {}).get("state")
                       == "failed", 15)
        record["flip_s"] = round(time.monotonic() - sent, 3) if flipped else None
        requests = os.environ.get("WATCH_PROBE_AA_REQUESTS")
        if requests:  # the stand-in writes its record within 0.1 s of the request
            wait(lambda: os.path.exists(requests) and os.path.getsize(requests), 10)
    record["unit_after"] = wait(lambda: unit() if unit().get("ActiveState") in (
        "inactive", "failed") else None, 30) or unit()
    record["status_after"] = read_json("/run/podvm-gpu/status.json")
    record["watch_after"] = read_json("/run/podvm-gpu/watch.json")
    out = "/srv/gpu/watch-probe.json" if ROOT != "/" else "/var/lib/watch-probe.json"
    with open(out, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
